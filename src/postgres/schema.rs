//! What postgresStore keeps in the database, for one `table` (and schema):
//! the fixed window in seed 000's table, and the sliding window's and the
//! token bucket's states in a table each, run by a PL/pgSQL function each
//! (one statement per call, on the database's clock). [`Names`] quotes every
//! name; [`ddl`] is the SQL that creates them all (docs/postgres.sql is that
//! SQL for the default names, checked by a test).
//!
//! The functions are ports of `sliding::{increment, decrement, consume}` and
//! `bucket::take`, rule for rule, as `sliding.lua` and `bucket.lua` are: the
//! same integers, exact (products of a count and µs go through `numeric`),
//! so every store answers alike. Each locks the key's row (`FOR UPDATE`),
//! then reads `clock_timestamp()`, so calls on one key apply in the order of
//! the times they read; a first write that meets another instance's insert
//! (`ON CONFLICT DO NOTHING` inserted nothing) starts over on that row.

use super::codes::COUNT_RANGE;
use crate::errors::{Backend, Error, Result};

/// PostgreSQL's longest identifier, in bytes (longer ones are cut).
const MAX_IDENTIFIER: usize = 63;
/// Appended to the table's name for the sliding window's and the bucket's
/// tables, and (with [`VERSION`]) their functions.
const SLIDING: &str = "_sw";
const BUCKET: &str = "_tb";
/// Appended (with [`VERSION`]) for the fixed window's function.
const FIXED: &str = "_fw";
/// The functions' version: a later release that changes a function's rules
/// creates it under a new name, so instances of both releases can share one
/// database while it rolls out.
const VERSION: &str = "_v1";
/// Appended to each table's name for the sweeper's index on its end column.
const INDEX: &str = "_ix";

fn config_error(text: impl Into<String>) -> Error {
    Error::Sql {
        store: Backend::Postgres,
        code: "ERR_CONFIG",
        text: text.into(),
        sent: None,
    }
}

/// A function's answer that is not what this release's functions answer.
pub fn wrong_shape() -> Error {
    Error::Sql {
        store: Backend::Postgres,
        code: "ERR_POSTGRES",
        sent: None,
        text: "a function of the store answered in the wrong shape (is it another release's?)"
            .into(),
    }
}

/// `name` quoted as an SQL identifier.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal, in the escape form (`E'…'`): its
/// meaning does not depend on `standard_conforming_strings`.
fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// Every name the store uses, quoted (and schema-qualified when a schema is given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    pub table: String,
    pub sliding: String,
    pub bucket: String,
    pub fixed_fn: String,
    pub sliding_fn: String,
    pub bucket_fn: String,
    /// The sweeper's indexes, of the three tables: (the bare name, quoted; the qualified name).
    indexes: [(String, String); 3],
    /// Names the advisory lock that makes instances create them one at a time.
    lock: String,
}

impl Names {
    pub fn new(table: &str, schema: Option<&str>) -> Result<Names> {
        let bad = |n: &str| n.is_empty() || n.contains('\0');
        if bad(table) || schema.is_some_and(bad) {
            return Err(config_error("table and schema must be non-empty names"));
        }
        // The DDL's bodies are dollar-quoted with these tags.
        let tag = |n: &str| n.contains("$ratestore$") || n.contains("$fn$");
        if tag(table) || schema.is_some_and(tag) {
            return Err(config_error(
                "table and schema may not hold $ratestore$ or $fn$ (the tags that quote the store's SQL)",
            ));
        }
        let longest = MAX_IDENTIFIER - SLIDING.len() - VERSION.len();
        if table.len() > longest || schema.is_some_and(|s| s.len() > MAX_IDENTIFIER) {
            return Err(config_error(format!(
                "table must be at most {longest} bytes long (and schema at most {MAX_IDENTIFIER}): \
                 PostgreSQL would cut the names of the tables and functions made from it"
            )));
        }
        let qualify = |name: String| match schema {
            Some(s) => format!("{}.{}", quote(s), quote(&name)),
            None => quote(&name),
        };
        Ok(Names {
            table: qualify(table.to_string()),
            sliding: qualify(format!("{table}{SLIDING}")),
            bucket: qualify(format!("{table}{BUCKET}")),
            fixed_fn: qualify(format!("{table}{FIXED}{VERSION}")),
            sliding_fn: qualify(format!("{table}{SLIDING}{VERSION}")),
            bucket_fn: qualify(format!("{table}{BUCKET}{VERSION}")),
            indexes: ["", SLIDING, BUCKET].map(|suffix| {
                let name = format!("{table}{suffix}{INDEX}");
                (quote(&name), qualify(name))
            }),
            lock: format!("ratestore:{}", qualify(table.to_string())),
        })
    }
}

/// µs since the epoch of a timestamptz, exactly (`extract` answers numeric).
fn micros(ts: &str) -> String {
    format!("(extract(epoch FROM {ts}) * 1000000)::int8")
}

/// The SQL that creates the tables and functions where they are missing:
/// `CREATE … IF NOT EXISTS`, and a function only when none of its name and
/// arguments exists (so a database user without ownership of it can still
/// start). Not wrapped in a transaction: see [`create_batch`].
pub fn ddl(n: &Names) -> String {
    let Names {
        table,
        sliding,
        bucket,
        fixed_fn,
        sliding_fn,
        bucket_fn,
        indexes,
        ..
    } = n;
    // The sweeper's index on a table's end column, made only while the table is
    // empty (at once): on a table with rows, CREATE INDEX would block writes while
    // it builds, so that is left to CREATE INDEX CONCURRENTLY (see docs/postgres.sql).
    let index = |i: usize, t: &str, column: &str| {
        let (bare, qualified) = &indexes[i];
        format!(
            "DO $ratestore$ BEGIN\n\
             IF to_regclass({}) IS NULL AND NOT EXISTS (SELECT FROM {t}) THEN\n\
             CREATE INDEX IF NOT EXISTS {bare} ON {t} ({column});\n\
             END IF;\n\
             END\n\
             $ratestore$;",
            literal(qualified)
        )
    };
    let fixed_ix = index(0, table, "reset_at");
    let sliding_ix = index(1, sliding, "expires_at");
    let bucket_ix = index(2, bucket, "expires_at");
    let now_us = micros("ts");
    let max_safe = crate::window::MAX_SAFE;
    // ceil(count * lft / win), exactly: the previous window's share.
    let weighted = |count: &str| {
        format!("CASE WHEN lft >= win THEN {count} ELSE div({count}::numeric * lft + (win - 1), win)::int8 END")
    };
    // The largest left in 0..most at which count, weighted, is at most room.
    let latest = |count: &str, room: &str, most: &str| {
        format!(
            "CASE WHEN {room} >= {count} THEN {most} \
             ELSE LEAST({most}, div(({room})::numeric * win, {count})::int8) END"
        )
    };
    let w_prev = weighted("prev");
    let latest_prev = latest("prev", "lim - amount - cur", "lft - 1");
    let latest_cur = latest("cur", "lim - amount", "win");
    format!(
        r#"-- The fixed window: seed 000's table (its counts are the seed's own).
CREATE TABLE IF NOT EXISTS {table} (
  key      text        PRIMARY KEY,
  total    bigint      NOT NULL,
  reset_at timestamptz NOT NULL
);
{fixed_ix}

-- The sliding window: per key, the counts of the window starting at start_us
-- (µs since the epoch, on the database's clock; a multiple of the window) and
-- of the one before. The row counts nothing from expires_at on.
CREATE TABLE IF NOT EXISTS {sliding} (
  key        text        PRIMARY KEY,
  start_us   bigint      NOT NULL,
  previous   bigint      NOT NULL,
  current    bigint      NOT NULL,
  expires_at timestamptz NOT NULL
);
{sliding_ix}

-- The token bucket: per key that is not full, its tokens and its last refill
-- (µs since the epoch). The bucket is full again (as with no row) from expires_at on.
CREATE TABLE IF NOT EXISTS {bucket} (
  key        text        PRIMARY KEY,
  tokens     bigint      NOT NULL,
  at_us      bigint      NOT NULL,
  expires_at timestamptz NOT NULL
);
{bucket_ix}

-- The functions count on the database's clock (clock_timestamp(), read once the key's row is
-- locked); clock_us, when given, is the time to count at instead (µs since the epoch), for tests.

-- The fixed window: op 0 hit(amount), 1 consume(amount: the cost, arg: the limit), 2 refund(amount,
-- arg: the window named, 0 for none). Answers {{count, resetMs}} (0, 2; resetMs 0: no open window,
-- or not the one named) or {{allowed, count, remaining, resetMs, window}} (1), as src/window.rs.
-- A window is open while reset_at's ms tick is after now's; its id is reset_at in µs.
DO $ratestore$ BEGIN
IF to_regprocedure({fixed_sig}) IS NULL THEN
CREATE FUNCTION {fixed_fn}(op int4, k text, window_ms int8, amount int8, arg int8, clock_us int8 DEFAULT NULL)
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
    SELECT c.total, c.reset_at INTO s FROM {table} c WHERE c.key = k FOR UPDATE;
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
      win := LEAST((extract(epoch FROM s.reset_at) * 1000000)::int8, {max_safe});
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
        UPDATE {table} c SET total = cnt - taken WHERE c.key = k;
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
      IF abs(cnt + amount) > {max_safe} THEN
        RAISE EXCEPTION 'the count would leave the safe-integer range' USING ERRCODE = '{COUNT_RANGE}';
      END IF;
      cnt := cnt + amount;
      UPDATE {table} c SET total = cnt WHERE c.key = k;
    ELSE
      cnt := amount;
      ends := ts + interval '1 millisecond' * window_ms;
      win := LEAST((extract(epoch FROM ends) * 1000000)::int8, {max_safe});
      IF had THEN
        UPDATE {table} c SET total = cnt, reset_at = ends WHERE c.key = k;
      ELSE
        INSERT INTO {table} AS c (key, total, reset_at) VALUES (k, cnt, ends) ON CONFLICT (key) DO NOTHING;
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
-- {{count, resetMs, window}} (0, 1) or {{allowed, count, remaining, resetMs,
-- retryMs, window}} (2), as src/sliding.rs.
DO $ratestore$ BEGIN
IF to_regprocedure({sliding_sig}) IS NULL THEN
CREATE FUNCTION {sliding_fn}(op int4, k text, window_ms int8, amount int8, arg int8, clock_us int8 DEFAULT NULL)
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
      FROM {sliding} r WHERE r.key = k FOR UPDATE;
    had := FOUND;
    ts := CASE WHEN clock_us IS NULL THEN clock_timestamp() ELSE 'epoch'::timestamptz + interval '1 microsecond' * clock_us END;
    now_us := {now_us};
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
    est := {w_prev} + cur;
    reset_ms := (lft + 999) / 1000;
    IF op = 0 THEN
      IF est + amount > {max_safe} THEN
        RAISE EXCEPTION 'the count would leave the safe-integer range' USING ERRCODE = '{COUNT_RANGE}';
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
      answer := ARRAY[{w_prev} + cur, reset_ms, st + win];
    ELSIF est + amount <= lim THEN
      IF amount > 0 THEN cur := cur + amount; changed := true; END IF;
      est := est + amount;
      answer := ARRAY[1, est, GREATEST(0, LEAST(lim, lim - est)), reset_ms, 0, st + win];
    ELSE
      IF amount > lim THEN
        retry_ms := CASE WHEN cur > 0 THEN (lft + win + 999) / 1000 ELSE reset_ms END;
      ELSIF cur + amount <= lim THEN
        retry_ms := (lft - {latest_prev} + 999) / 1000;
      ELSE
        retry_ms := (lft + win - {latest_cur} + 999) / 1000;
      END IF;
      answer := ARRAY[0, est, GREATEST(0, LEAST(lim, lim - est)), reset_ms, retry_ms, st + win];
    END IF;
    IF changed THEN
      IF prev = 0 AND cur = 0 THEN
        DELETE FROM {sliding} r WHERE r.key = k;
      ELSIF had THEN
        UPDATE {sliding} r SET start_us = st, previous = prev, current = cur,
          expires_at = 'epoch'::timestamptz + interval '1 microsecond' * (st + (CASE WHEN cur > 0 THEN 2 ELSE 1 END) * win)
          WHERE r.key = k;
      ELSE
        INSERT INTO {sliding} AS r (key, start_us, previous, current, expires_at)
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

-- tokenBucket: answers {{allowed, remaining, retryMs, resetMs}}, as src/bucket.rs.
DO $ratestore$ BEGIN
IF to_regprocedure({bucket_sig}) IS NULL THEN
CREATE FUNCTION {bucket_fn}(k text, capacity int8, refill int8, interval_ms int8, cost int8, clock_us int8 DEFAULT NULL)
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
    SELECT b.tokens, b.at_us, b.expires_at INTO s FROM {bucket} b WHERE b.key = k FOR UPDATE;
    had := FOUND;
    ts := CASE WHEN clock_us IS NULL THEN clock_timestamp() ELSE 'epoch'::timestamptz + interval '1 microsecond' * clock_us END;
    now_us := {now_us};
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
          UPDATE {bucket} b SET tokens = remaining, at_us = at,
            expires_at = 'epoch'::timestamptz + interval '1 microsecond' * ends WHERE b.key = k;
        ELSE
          INSERT INTO {bucket} AS b (key, tokens, at_us, expires_at)
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
"#,
        fixed_sig = literal(&format!("{fixed_fn}(int4, text, int8, int8, int8, int8)")),
        sliding_sig = literal(&format!("{sliding_fn}(int4, text, int8, int8, int8, int8)")),
        bucket_sig = literal(&format!("{bucket_fn}(text, int8, int8, int8, int8, int8)")),
    )
}

/// [`ddl`] in one transaction, under an advisory lock on the table's name,
/// so that instances starting together create everything one at a time (a
/// concurrent `CREATE … IF NOT EXISTS` can still fail on the catalog's
/// unique index).
pub fn create_batch(n: &Names) -> String {
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext({})); {} COMMIT",
        literal(&n.lock),
        ddl(n)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_derived() {
        let n = Names::new("we\"ird", Some("s")).unwrap();
        assert_eq!(n.table, "\"s\".\"we\"\"ird\"");
        assert_eq!(n.sliding, "\"s\".\"we\"\"ird_sw\"");
        assert_eq!(n.bucket_fn, "\"s\".\"we\"\"ird_tb_v1\"");
        let n = Names::new("askdare_counters", None).unwrap();
        assert_eq!(n.sliding_fn, "\"askdare_counters_sw_v1\"");
    }

    #[test]
    fn names_that_postgres_would_cut_are_refused() {
        assert!(Names::new(&"a".repeat(57), None).is_ok());
        let err = Names::new(&"a".repeat(58), None).unwrap_err();
        assert_eq!(err.code(), "ERR_CONFIG");
        assert!(Names::new("", None).is_err());
        assert!(Names::new("t", Some("")).is_err());
        assert!(Names::new("t\0", None).is_err());
    }

    #[test]
    fn the_documented_sql_is_the_store_s() {
        let doc = include_str!("../../docs/postgres.sql");
        let ddl = ddl(&Names::new("askdare_counters", None).unwrap());
        assert!(
            doc.contains(&ddl),
            "docs/postgres.sql must hold ddl() for the default names verbatim"
        );
    }
}
