-- What postgresStore keeps in the database, for the default names (table askdare_counters, no
-- schema). postgresStore creates it all on first use; run this yourself (and pass createTable:
-- false) where the app's database user has no DDL rights. With the `table` option, replace
-- askdare_counters everywhere (the other names are made from it: TABLE_sw, TABLE_tb, the functions
-- TABLE_fw_v1, TABLE_sw_v1, TABLE_tb_v1 and the indexes TABLE_ix, TABLE_sw_ix, TABLE_tb_ix); with
-- `schema`, qualify each name with it. An app that uses the fixed window alone needs only the first
-- table and TABLE_fw_v1. The indexes serve the store's sweeper (sweepIntervalMs); each is made only while its table
-- is empty. On a table that already holds rows (seed 000's, say), make it without blocking writes:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS askdare_counters_ix ON askdare_counters (reset_at);

-- The fixed window: seed 000's table (its counts are the seed's own).
CREATE TABLE IF NOT EXISTS "askdare_counters" (
  key      text        PRIMARY KEY,
  total    bigint      NOT NULL,
  reset_at timestamptz NOT NULL
);
DO $ratestore$ BEGIN
IF to_regclass(E'"askdare_counters_ix"') IS NULL AND NOT EXISTS (SELECT FROM "askdare_counters") THEN
CREATE INDEX IF NOT EXISTS "askdare_counters_ix" ON "askdare_counters" (reset_at);
END IF;
END
$ratestore$;

-- The sliding window: per key, the counts of the window starting at start_us
-- (µs since the epoch, on the database's clock; a multiple of the window) and
-- of the one before. The row counts nothing from expires_at on.
CREATE TABLE IF NOT EXISTS "askdare_counters_sw" (
  key        text        PRIMARY KEY,
  start_us   bigint      NOT NULL,
  previous   bigint      NOT NULL,
  current    bigint      NOT NULL,
  expires_at timestamptz NOT NULL
);
DO $ratestore$ BEGIN
IF to_regclass(E'"askdare_counters_sw_ix"') IS NULL AND NOT EXISTS (SELECT FROM "askdare_counters_sw") THEN
CREATE INDEX IF NOT EXISTS "askdare_counters_sw_ix" ON "askdare_counters_sw" (expires_at);
END IF;
END
$ratestore$;

-- The token bucket: per key that is not full, its tokens and its last refill
-- (µs since the epoch). The bucket is full again (as with no row) from expires_at on.
CREATE TABLE IF NOT EXISTS "askdare_counters_tb" (
  key        text        PRIMARY KEY,
  tokens     bigint      NOT NULL,
  at_us      bigint      NOT NULL,
  expires_at timestamptz NOT NULL
);
DO $ratestore$ BEGIN
IF to_regclass(E'"askdare_counters_tb_ix"') IS NULL AND NOT EXISTS (SELECT FROM "askdare_counters_tb") THEN
CREATE INDEX IF NOT EXISTS "askdare_counters_tb_ix" ON "askdare_counters_tb" (expires_at);
END IF;
END
$ratestore$;

-- The functions count on the database's clock (clock_timestamp(), read once the key's row is
-- locked); clock_us, when given, is the time to count at instead (µs since the epoch), for tests.

-- The fixed window: op 0 hit(amount), 1 consume(amount: the cost, arg: the limit), 2 refund(amount,
-- arg: the window named, 0 for none). Answers {count, resetMs} (0, 2; resetMs 0: no open window,
-- or not the one named) or {allowed, count, remaining, resetMs, window} (1), as src/window.rs.
-- A window is open while reset_at's ms tick is after now's; its id is reset_at in µs.
DO $ratestore$ BEGIN
IF to_regprocedure(E'"askdare_counters_fw_v1"(int4, text, int8, int8, int8, int8)') IS NULL THEN
CREATE FUNCTION "askdare_counters_fw_v1"(op int4, k text, window_ms int8, amount int8, arg int8, clock_us int8 DEFAULT NULL)
RETURNS int8[] LANGUAGE plpgsql AS $fn$
DECLARE
  s      record;
  had    boolean;
  ts     timestamptz;
  now_ms int8;
  end_ms int8;
  open   boolean;
  cnt    int8;
  reset_ms int8;
  win    int8;
  taken  int8;
  ends   timestamptz;
BEGIN
  LOOP
    SELECT c.total, c.reset_at INTO s FROM "askdare_counters" c WHERE c.key = k FOR UPDATE;
    had := FOUND;
    ts := CASE WHEN clock_us IS NULL THEN clock_timestamp() ELSE 'epoch'::timestamptz + interval '1 microsecond' * clock_us END;
    now_ms := floor(extract(epoch FROM ts) * 1000)::int8;
    open := false;
    IF had THEN
      end_ms := floor(extract(epoch FROM s.reset_at) * 1000)::int8;
      open := end_ms > now_ms;
    END IF;
    IF open THEN
      cnt := s.total;
      reset_ms := end_ms - now_ms;
      win := LEAST((extract(epoch FROM s.reset_at) * 1000000)::int8, 9007199254740991);
    ELSE
      cnt := 0;
      reset_ms := window_ms;
      win := 0;
    END IF;
    IF op = 2 THEN
      IF NOT open OR (arg <> 0 AND win <> arg) THEN
        RETURN ARRAY[0, 0];
      END IF;
      taken := LEAST(amount, GREATEST(cnt, 0));
      IF taken > 0 THEN
        UPDATE "askdare_counters" c SET total = cnt - taken WHERE c.key = k;
      END IF;
      RETURN ARRAY[cnt - taken, reset_ms];
    END IF;
    IF op = 0 AND amount = 0 THEN
      RETURN ARRAY[cnt, reset_ms];
    END IF;
    IF op = 1 AND (cnt + amount > arg OR amount = 0) THEN
      -- Refused, or a read: nothing changes.
      RETURN ARRAY[(cnt + amount <= arg)::int4, cnt, GREATEST(0, LEAST(arg, arg - cnt)), reset_ms, win];
    END IF;
    IF open THEN
      IF abs(cnt + amount) > 9007199254740991 THEN
        RAISE EXCEPTION 'the count would leave the safe-integer range' USING ERRCODE = 'RS001';
      END IF;
      cnt := cnt + amount;
      UPDATE "askdare_counters" c SET total = cnt WHERE c.key = k;
    ELSE
      cnt := amount;
      ends := ts + interval '1 millisecond' * window_ms;
      win := LEAST((extract(epoch FROM ends) * 1000000)::int8, 9007199254740991);
      IF had THEN
        UPDATE "askdare_counters" c SET total = cnt, reset_at = ends WHERE c.key = k;
      ELSE
        INSERT INTO "askdare_counters" AS c (key, total, reset_at) VALUES (k, cnt, ends) ON CONFLICT (key) DO NOTHING;
        -- Another instance inserted the key meanwhile: start over on its row.
        CONTINUE WHEN NOT FOUND;
      END IF;
    END IF;
    IF op = 0 THEN
      RETURN ARRAY[cnt, reset_ms];
    END IF;
    RETURN ARRAY[1, cnt, GREATEST(0, LEAST(arg, arg - cnt)), reset_ms, win];
  END LOOP;
END
$fn$;
END IF;
END
$ratestore$;

-- slidingWindow: op 0 increment(amount), 1 decrement(amount, arg: the window
-- named, 0 for none), 2 consume(amount: the cost, arg: the limit). Answers
-- {count, resetMs, window} (0, 1) or {allowed, count, remaining, resetMs,
-- retryMs, window} (2), as src/sliding.rs.
DO $ratestore$ BEGIN
IF to_regprocedure(E'"askdare_counters_sw_v1"(int4, text, int8, int8, int8, int8)') IS NULL THEN
CREATE FUNCTION "askdare_counters_sw_v1"(op int4, k text, window_ms int8, amount int8, arg int8, clock_us int8 DEFAULT NULL)
RETURNS int8[] LANGUAGE plpgsql AS $fn$
DECLARE
  win  int8 := window_ms * 1000;
  lim  int8 := arg;
  s    record;
  had  boolean;
  ts   timestamptz;
  now_us int8;
  st   int8;
  lft  int8;
  prev int8;
  cur  int8;
  est  int8;
  reset_ms int8;
  from_cur  int8;
  from_prev int8;
  changed boolean;
  retry_ms int8;
  answer int8[];
BEGIN
  LOOP
    SELECT r.start_us, r.previous, r.current, r.expires_at INTO s
      FROM "askdare_counters_sw" r WHERE r.key = k FOR UPDATE;
    had := FOUND;
    ts := CASE WHEN clock_us IS NULL THEN clock_timestamp() ELSE 'epoch'::timestamptz + interval '1 microsecond' * clock_us END;
    now_us := (extract(epoch FROM ts) * 1000000)::int8;
    st := now_us - now_us % win;
    lft := win - now_us % win;
    prev := 0;
    cur := 0;
    from_cur := 0;
    from_prev := 0;
    changed := false;
    IF had AND s.expires_at > ts THEN
      IF s.start_us >= st THEN
        -- A start ahead of the clock (the clock set back) still counts in full.
        st := s.start_us; prev := s.previous; cur := s.current;
      ELSIF s.start_us + win = st THEN
        prev := s.current;
      END IF;
    END IF;
    est := CASE WHEN lft >= win THEN prev ELSE div(prev::numeric * lft + (win - 1), win)::int8 END + cur;
    reset_ms := (lft + 999) / 1000;
    IF op = 0 THEN
      IF est + amount > 9007199254740991 THEN
        RAISE EXCEPTION 'the count would leave the safe-integer range' USING ERRCODE = 'RS001';
      END IF;
      IF amount > 0 THEN cur := cur + amount; changed := true; END IF;
      answer := ARRAY[est + amount, reset_ms, st + win];
    ELSIF op = 1 THEN
      IF arg = 0 THEN
        from_cur := LEAST(amount, cur);
        from_prev := LEAST(amount - from_cur, prev);
      ELSIF arg = st + win THEN
        from_cur := LEAST(amount, cur);
      ELSIF arg = st THEN
        from_prev := LEAST(amount, prev);
      END IF;
      IF from_cur + from_prev > 0 THEN
        cur := cur - from_cur; prev := prev - from_prev; changed := true;
      END IF;
      answer := ARRAY[CASE WHEN lft >= win THEN prev ELSE div(prev::numeric * lft + (win - 1), win)::int8 END + cur, reset_ms, st + win];
    ELSIF est + amount <= lim THEN
      IF amount > 0 THEN cur := cur + amount; changed := true; END IF;
      est := est + amount;
      answer := ARRAY[1, est, GREATEST(0, LEAST(lim, lim - est)), reset_ms, 0, st + win];
    ELSE
      IF amount > lim THEN
        retry_ms := CASE WHEN cur > 0 THEN (lft + win + 999) / 1000 ELSE reset_ms END;
      ELSIF cur + amount <= lim THEN
        retry_ms := (lft - CASE WHEN lim - amount - cur >= prev THEN lft - 1 ELSE LEAST(lft - 1, div((lim - amount - cur)::numeric * win, prev)::int8) END + 999) / 1000;
      ELSE
        retry_ms := (lft + win - CASE WHEN lim - amount >= cur THEN win ELSE LEAST(win, div((lim - amount)::numeric * win, cur)::int8) END + 999) / 1000;
      END IF;
      answer := ARRAY[0, est, GREATEST(0, LEAST(lim, lim - est)), reset_ms, retry_ms, st + win];
    END IF;
    IF changed THEN
      IF prev = 0 AND cur = 0 THEN
        DELETE FROM "askdare_counters_sw" r WHERE r.key = k;
      ELSIF had THEN
        UPDATE "askdare_counters_sw" r SET start_us = st, previous = prev, current = cur,
          expires_at = 'epoch'::timestamptz + interval '1 microsecond' * (st + (CASE WHEN cur > 0 THEN 2 ELSE 1 END) * win)
          WHERE r.key = k;
      ELSE
        INSERT INTO "askdare_counters_sw" AS r (key, start_us, previous, current, expires_at)
          VALUES (k, st, prev, cur, 'epoch'::timestamptz + interval '1 microsecond' * (st + (CASE WHEN cur > 0 THEN 2 ELSE 1 END) * win))
          ON CONFLICT (key) DO NOTHING;
        -- Another instance inserted the key meanwhile: start over on its row.
        CONTINUE WHEN NOT FOUND;
      END IF;
    END IF;
    RETURN answer;
  END LOOP;
END
$fn$;
END IF;
END
$ratestore$;

-- tokenBucket: answers {allowed, remaining, retryMs, resetMs}, as src/bucket.rs.
DO $ratestore$ BEGIN
IF to_regprocedure(E'"askdare_counters_tb_v1"(text, int8, int8, int8, int8, int8)') IS NULL THEN
CREATE FUNCTION "askdare_counters_tb_v1"(k text, capacity int8, refill int8, interval_ms int8, cost int8, clock_us int8 DEFAULT NULL)
RETURNS int8[] LANGUAGE plpgsql AS $fn$
DECLARE
  iv   int8 := interval_ms * 1000;
  s    record;
  had  boolean;
  ts   timestamptz;
  now_us int8;
  tokens int8;
  at   int8;
  missing int8;
  refills int8;
  remaining int8;
  ends int8;
  reset_ms int8;
  retry_ms int8;
BEGIN
  LOOP
    SELECT b.tokens, b.at_us, b.expires_at INTO s FROM "askdare_counters_tb" b WHERE b.key = k FOR UPDATE;
    had := FOUND;
    ts := CASE WHEN clock_us IS NULL THEN clock_timestamp() ELSE 'epoch'::timestamptz + interval '1 microsecond' * clock_us END;
    now_us := (extract(epoch FROM ts) * 1000000)::int8;
    tokens := capacity;
    at := now_us;
    IF had AND s.expires_at > ts THEN
      missing := capacity - s.tokens;
      IF missing > 0 THEN
        -- A clock set back refills nothing until it passes at_us again.
        refills := CASE WHEN now_us > s.at_us THEN (now_us - s.at_us) / iv ELSE 0 END;
        IF refills < (missing + refill - 1) / refill THEN
          tokens := s.tokens + refills * refill;
          at := s.at_us + refills * iv;
        END IF;
      END IF;
    END IF;
    IF cost <= tokens THEN
      remaining := tokens - cost;
      ends := at + ((GREATEST(capacity - remaining, 0) + refill - 1) / refill) * iv;
      IF cost > 0 THEN
        IF had THEN
          UPDATE "askdare_counters_tb" b SET tokens = remaining, at_us = at,
            expires_at = 'epoch'::timestamptz + interval '1 microsecond' * ends WHERE b.key = k;
        ELSE
          INSERT INTO "askdare_counters_tb" AS b (key, tokens, at_us, expires_at)
            VALUES (k, remaining, at, 'epoch'::timestamptz + interval '1 microsecond' * ends)
            ON CONFLICT (key) DO NOTHING;
          -- Another instance inserted the key meanwhile: start over on its row.
          CONTINUE WHEN NOT FOUND;
        END IF;
      END IF;
      RETURN ARRAY[1, remaining, 0, CASE WHEN ends <= now_us THEN 0 ELSE (ends - now_us + 999) / 1000 END];
    END IF;
    ends := at + ((GREATEST(capacity - tokens, 0) + refill - 1) / refill) * iv;
    reset_ms := CASE WHEN ends <= now_us THEN 0 ELSE (ends - now_us + 999) / 1000 END;
    IF cost > capacity THEN
      retry_ms := GREATEST(reset_ms, 1);
    ELSE
      ends := at + ((GREATEST(cost - tokens, 0) + refill - 1) / refill) * iv;
      retry_ms := CASE WHEN ends <= now_us THEN 0 ELSE (ends - now_us + 999) / 1000 END;
    END IF;
    RETURN ARRAY[0, tokens, retry_ms, reset_ms];
  END LOOP;
END
$fn$;
END IF;
END
$ratestore$;

-- The app's user needs only these rights:
-- GRANT SELECT, INSERT, UPDATE, DELETE ON askdare_counters, askdare_counters_sw, askdare_counters_tb TO app_user;
-- GRANT EXECUTE ON FUNCTION askdare_counters_fw_v1(int4, text, int8, int8, int8, int8),
--   askdare_counters_sw_v1(int4, text, int8, int8, int8, int8),
--   askdare_counters_tb_v1(text, int8, int8, int8, int8, int8) TO app_user;

-- Ended windows are restarted in place by the next call; the store's sweeper deletes the rows that
-- count nothing, in batches of 500 (every sweepIntervalMs, default 60 s; skipping rows a call holds).
-- With the sweeper off (sweepIntervalMs: 0), remove them from cron (pg_cron or any scheduler), as
-- seed 000 suggests:
-- DELETE FROM askdare_counters WHERE reset_at < now();
-- DELETE FROM askdare_counters_sw WHERE expires_at < now();
-- DELETE FROM askdare_counters_tb WHERE expires_at < now();
