import { randomUUID } from 'node:crypto';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { connect, createServer, type AddressInfo } from 'node:net';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore, type PostgresStoreOptions } from '../index.js';
import { loneSurrogatesMadeTogether, rateLimitStoreContract } from './contract.js';
import { expressSuite } from './express-suite.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite } from './operations-suite.js';
import { universalSuite } from './universal-suite.js';
import {
  PASSWORD,
  plainPostgres,
  startPgbouncer,
  startPostgres,
  type Pgbouncer,
  type PostgresServer,
} from './support/postgres.js';
import { makeCertificates } from './support/redis.js';
import { envScope, urlFromEnvCases } from './support/env.js';
import { freePort } from '../scripts/free-port.js';

let server: Awaited<ReturnType<typeof plainPostgres>>;
beforeAll(async () => {
  server = await plainPostgres();
}, 120_000);
afterAll(() => server?.stop());

// The shared suites' stores use tables of this file's own, so that their resetAll() empties only
// what they wrote (as redisStore's suites use a prefix of their own).
const table = `suites_${randomUUID().replace(/-/g, '')}`;
const make = (options: PostgresStoreOptions = {}) =>
  postgresStore({ url: server.url, table, timeoutMs: 5_000, ...options });

rateLimitStoreContract('postgresStore', () => make());
limiterSuite('postgresStore', () => make());
operationsSuite('postgresStore', () => make());
// The adapters' suites count on fixed keys (the client's address) in each test: a table per store.
const isolated = () => make({ table: `adapter_${randomUUID().replace(/-/g, '')}` });
universalSuite('postgresStore', isolated);
expressSuite('postgresStore', isolated);

const KEY_MARKER = '203.0.113.77-pg-key-marker';

/** The error `pending` rejects with; it must name no key, password or URL. */
async function rejection(pending: Promise<unknown>): Promise<Error & { code?: string }> {
  const error = await pending.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e as Error & { code?: string },
  );
  for (const secret of [KEY_MARKER, PASSWORD, 'postgres://']) expect(String(error.message)).not.toContain(secret);
  return error;
}

const withEnv = envScope(['DATABASE_URL', 'POSTGRES_URL']);

/** `processes` instances, a process each, `inFlight` requests at a time for `ms`, on one table. */
async function fleet(url: string, table: string, processes: number, inFlight: number, ms: number) {
  type Report = {
    requests: number;
    failed: number;
    failures: Record<string, number>;
    sums: Record<string, number>;
    slowest: number;
  };
  const script = join(__dirname, 'fixtures', 'pg-fleet-child.js');
  const children = Array.from({ length: processes }, () =>
    spawn(process.execPath, [script, url, table, String(ms), String(inFlight), '50', '5'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    }),
  );
  // Listened for at once: a child may exit before its report is read.
  const exits = children.map((child) => new Promise((resolve) => child.once('exit', resolve)));
  const lines = children.map((child) => createInterface({ input: child.stdout! })[Symbol.asyncIterator]());
  for (const next of lines) expect((await next.next()).value).toBe('ready');
  for (const child of children) child.stdin!.end('go\n');
  const reports: Report[] = [];
  for (const next of lines) reports.push(JSON.parse((await next.next()).value as string) as Report);
  await Promise.all(exits);
  const sums: Record<string, number> = {};
  for (const r of reports) for (const [key, n] of Object.entries(r.sums)) sums[key] = (sums[key] ?? 0) + n;
  return { reports, sums };
}

/** Every row's total of `table`, by key. */
const totals = async (sql: (s: string) => Promise<string>, table: string) =>
  JSON.parse(await sql(`SELECT coalesce(json_object_agg(key, total), '{}') FROM ${table}`)) as Record<string, number>;

describe('postgresStore', () => {
  let own: PostgresServer;
  beforeAll(async () => {
    own = await startPostgres();
  }, 120_000);
  afterAll(() => own?.stop());
  const ownStore = (options: PostgresStoreOptions = {}) =>
    postgresStore({ url: own.url, timeoutMs: 3_000, ...options });

  urlFromEnvCases({
    create: () => postgresStore(),
    variable: 'POSTGRES_URL',
    url: () => own.url,
    badUrl: 'postgres://nobody@127.0.0.1:1/none',
    withEnv,
    rejection,
    key: KEY_MARKER,
  });

  it('rejects a wrong password with ERR_AUTH, naming neither password nor URL', async () => {
    const url = own.url.replace(PASSWORD, 'wrong-secret-7d1f');
    const error = await rejection(postgresStore({ url }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_AUTH');
    expect(error.message).not.toContain('wrong-secret-7d1f');
  });

  it('refuses bad options with a TypeError or RangeError', () => {
    expect(() => postgresStore({ url: 1 as unknown as string })).toThrow(TypeError);
    expect(() => postgresStore({ timeoutMs: 0 })).toThrow(RangeError);
    expect(() => postgresStore({ nope: 1 } as unknown as PostgresStoreOptions)).toThrow(TypeError);
    expect(() => postgresStore({ sslmode: 'allow' as 'disable' })).toThrow(RangeError);
    expect(() => postgresStore({ sslmode: 1 as unknown as 'disable' })).toThrow(TypeError);
    expect(() => postgresStore({ tls: { ca: 1 as unknown as string } })).toThrow(TypeError);
    expect(() => postgresStore({ tls: { cert: 'x' } as unknown as { ca: string } })).toThrow(TypeError);
  });

  it('with createTable false, nothing created rejects with ERR_POSTGRES (42883, the missing function; 42P01 for the upsert of a hit) and creates nothing', async () => {
    const table = `missing_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table, createTable: false });
    const error = await rejection(store.consume(KEY_MARKER, { limit: 5, windowMs: 60_000 }));
    expect(error.code).toBe('ERR_POSTGRES');
    expect(error.message).toContain('42883');
    const hit = await rejection(store.hit(KEY_MARKER, 60_000, 1));
    expect(hit.code).toBe('ERR_POSTGRES');
    expect(hit.message).toContain('42P01');
    expect(await own.sql(`SELECT count(*) FROM pg_tables WHERE tablename = '${table}'`)).toBe('0');
    await store.close();
  });

  it('creates its table on first use, once, when many stores start at once', async () => {
    const table = `race_${randomUUID().replace(/-/g, '')}`;
    const stores = Array.from({ length: 8 }, () => ownStore({ table }));
    const hits = await Promise.all(stores.map((store) => store.hit('k', 60_000, 1)));
    expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(await own.sql(`SELECT total FROM ${table} WHERE key = 'k'`)).toBe('8');
    await Promise.all(stores.map((store) => store.close()));
  });

  it("continues the seed's own SQL count, and the seed's SQL continues the store's", async () => {
    const store = ownStore();
    await store.ping(); // creates askdare_counters
    const key = `seed:${randomUUID()}`;
    // Seed 000's upsert, verbatim in shape.
    const seedHit = (amount: number) =>
      own.sql(`INSERT INTO askdare_counters AS c (key, total, reset_at)
        VALUES ('${key}', ${amount}, now() + make_interval(secs => 60000::float8 / 1000))
        ON CONFLICT (key) DO UPDATE SET
          total = CASE WHEN c.reset_at <= now() THEN EXCLUDED.total ELSE c.total + EXCLUDED.total END,
          reset_at = CASE WHEN c.reset_at <= now() THEN EXCLUDED.reset_at ELSE c.reset_at END
        RETURNING total`);
    expect(await seedHit(3)).toBe('3');
    const next = await store.hit(key, 60_000, 2);
    expect(next.count).toBe(5);
    expect(next.resetMs).toBeGreaterThan(59_000);
    expect(next.resetMs).toBeLessThanOrEqual(60_000);
    expect(await seedHit(1)).toBe('6');
    expect((await store.hit(key, 60_000, 0)).count).toBe(6);
    await store.close();
  });

  it('a read (amount 0) creates no row', async () => {
    const store = ownStore();
    const key = `read:${randomUUID()}`;
    expect(await store.hit(key, 30_000, 0)).toEqual({ count: 0, resetMs: 30_000 });
    expect(await own.sql(`SELECT count(*) FROM askdare_counters WHERE key = '${key}'`)).toBe('0');
    await store.close();
  });

  it('consume and refund follow the fixed-window rules', async () => {
    const store = ownStore();
    const key = `consume:${randomUUID()}`;
    const results = await Promise.all(
      Array.from({ length: 20 }, () => store.consume(key, { limit: 5, windowMs: 60_000 })),
    );
    expect(results.filter((r) => r.allowed)).toHaveLength(5);
    const refused = results.find((r) => !r.allowed)!;
    expect(refused).toMatchObject({ count: 5, remaining: 0 });
    expect(await store.refund(key, 2)).toMatchObject({ count: 3 });
    expect(await store.refund(key, 10)).toMatchObject({ count: 0 });
    expect(await store.refund(`none:${randomUUID()}`, 1)).toBeNull();
    await store.reset(key);
    expect((await store.hit(key, 60_000, 0)).count).toBe(0);
    await store.close();
  });

  it('rejects while the server is down and succeeds once it is back (pg_ctl stop / start)', async () => {
    const store = ownStore({ timeoutMs: 2_000 });
    const key = `restart:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    await own.halt();
    try {
      const error = await rejection(store.hit(key, 60_000, 1));
      expect(['ERR_CONNECTION', 'ERR_TIMEOUT', 'ERR_POSTGRES']).toContain(error.code);
    } finally {
      await own.start();
    }
    expect((await store.hit(key, 60_000, 1)).count).toBe(2);
    await own.restart();
    // The connection from before the restart is gone: at most one call fails, then it reconnects.
    await store.hit(key, 60_000, 1).catch(() => undefined);
    expect((await store.hit(key, 60_000, 0)).count).toBeGreaterThanOrEqual(2);
    await store.close();
  }, 60_000);

  it('reconnects after its connection is killed (pg_terminate_backend)', async () => {
    const store = ownStore();
    const key = `killed:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const killed = await own.sql(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    );
    expect(Number(killed)).toBeGreaterThanOrEqual(1);
    // The first call after the kill may fail (its connection is gone); it never counts twice.
    let counted = 1;
    const first = await store.hit(key, 60_000, 1).then(
      () => {
        counted++;
        return 'ok';
      },
      (e: { code?: string }) => e.code,
    );
    // The server's goodbye (57P01) is a lost connection, as a closed socket is.
    expect(['ok', 'ERR_CONNECTION']).toContain(first);
    expect((await store.hit(key, 60_000, 0)).count).toBe(counted);
    await store.close();
  }, 30_000);

  /** A store on tables of its own, created by a first ping, and SQL on its state tables. */
  async function ownTables() {
    const table = `t_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table });
    await store.ping();
    const sql = own.sql;
    /** Writes a sliding-window state: the window starting at startMs (epoch ms), counting until endsMs. */
    const slidingState = (key: string, startMs: number, previous: number, current: number, endsMs: number) =>
      sql(`INSERT INTO ${table}_sw VALUES ('${key}', ${startMs * 1000}, ${previous}, ${current},
        'epoch'::timestamptz + interval '1 microsecond' * ${endsMs * 1000})`);
    /** The sliding-window function at an explicit time (µs since the epoch), as {a,b,...}. */
    const sliding = (op: number, key: string, windowMs: number, amount: number, arg: number, atUs: number) =>
      sql(`SELECT ${table}_sw_v1(${op}, '${key}', ${windowMs}, ${amount}, ${arg}, ${atUs})`);
    const bucket = (key: string, capacity: number, refill: number, intervalMs: number, cost: number, atUs: number) =>
      sql(`SELECT ${table}_tb_v1('${key}', ${capacity}, ${refill}, ${intervalMs}, ${cost}, ${atUs})`);
    return { table, store, sql, slidingState, sliding, bucket };
  }

  it('keeps the sliding window in TABLE_sw: increment, consume and decrement naming its window', async () => {
    const { table, store, sql } = await ownTables();
    const key = `sw:${randomUUID()}`;
    const year = 365 * 24 * 3600 * 1000;
    const first = await store.slidingWindow.increment(key, year);
    expect(first.count).toBe(1);
    expect(first.resetMs).toBeGreaterThan(0);
    expect(first.resetMs).toBeLessThanOrEqual(year);
    const second = await store.slidingWindow.increment(key, year, 2);
    expect(second).toMatchObject({ count: 3, window: first.window });
    expect(await sql(`SELECT current FROM ${table}_sw WHERE key = '${key}'`)).toBe('3');
    // A decrement naming another window gives nothing back; naming its own, it does.
    expect((await store.slidingWindow.decrement(key, year, 1, { window: first.window + 1 })).count).toBe(3);
    expect((await store.slidingWindow.decrement(key, year, 1, { window: first.window })).count).toBe(2);
    const results = await Promise.all(
      Array.from({ length: 12 }, () => store.slidingWindow.consume(key, { limit: 7, windowMs: year })),
    );
    expect(results.filter((r) => r.allowed)).toHaveLength(5);
    const refused = results.find((r) => !r.allowed)!;
    expect(refused).toMatchObject({ count: 7, remaining: 0, window: first.window });
    expect(refused.retryMs).toBeGreaterThan(0);
    // Taken back to nothing, the state is removed.
    await store.slidingWindow.decrement(key, year, 100);
    expect(await sql(`SELECT count(*) FROM ${table}_sw WHERE key = '${key}'`)).toBe('0');
    await store.close();
  });

  it('answers the sliding window exactly as src/sliding.rs, at the times its tests use', async () => {
    const { store, slidingState, sliding } = await ownTables();
    const W = 10_000;
    const MS = 1000;
    const MAX = Number.MAX_SAFE_INTEGER;
    const cases: [string, () => Promise<string>, string][] = [];
    let n = 0;
    const at = (
      state: [number, number, number] | null,
      op: number,
      amount: number,
      arg: number,
      atUs: number,
      expected: string,
    ) => {
      const key = `case${n++}`;
      cases.push([
        key,
        async () => {
          if (state) await slidingState(key, state[0], state[1], state[2], state[0] + 2 * W);
          return sliding(op, key, W, amount, arg, atUs);
        },
        expected,
      ]);
    };
    // increment: [count, resetMs, window]
    at(null, 0, 1, 0, 25_000 * MS, `{1,5000,${30_000 * MS}}`);
    at([10_000, 0, 8], 0, 0, 0, 22_500 * MS, `{6,7500,${30_000 * MS}}`);
    at([10_000, 0, 8], 0, 0, 0, 22_501 * MS, `{6,7499,${30_000 * MS}}`);
    at([10_000, 0, 1], 0, 0, 0, 29_999_999, `{1,1,${30_000 * MS}}`);
    at([10_000, 0, 8], 0, 0, 0, 20_000 * MS, `{8,10000,${30_000 * MS}}`);
    at([10_000, 5, 8], 0, 0, 0, 30_000 * MS, `{0,10000,${40_000 * MS}}`);
    at([20_000, 3, 4], 0, 1, 0, 15_000 * MS, `{7,5000,${30_000 * MS}}`);
    // Exact at the top of the range: half of MAX_SAFE still weighs, rounded up.
    at([0, 0, MAX], 0, 1, 0, 15_000 * MS, `{${(MAX + 1) / 2 + 1},5000,${20_000 * MS}}`);
    // decrement: from current, then previous; naming a window, only from it.
    at([20_000, 4, 2], 1, 3, 0, 25_000 * MS, `{2,5000,${30_000 * MS}}`);
    at([20_000, 4, 2], 1, 1, 30_000 * MS, 30_000 * MS, `{1,10000,${40_000 * MS}}`);
    at([40_000, 2, 5], 1, 1, 30_000 * MS, 45_000 * MS, `{6,5000,${50_000 * MS}}`);
    // consume: [allowed, count, remaining, resetMs, retryMs, window]
    at([10_000, 0, 8], 2, 4, 10, 22_500 * MS, `{1,10,0,7500,0,${30_000 * MS}}`);
    at([10_000, 0, 8], 2, 6, 10, 22_500 * MS, `{0,6,4,7500,2500,${30_000 * MS}}`);
    at([10_000, 0, 8], 2, 5, 10, 22_500 * MS, `{0,6,4,7500,1250,${30_000 * MS}}`);
    at([10_000, 0, 8], 2, 6, 10, 25_000 * MS, `{1,10,0,5000,0,${30_000 * MS}}`);
    at([10_000, 0, 8], 2, 6, 10, 25_000 * MS - 1, `{0,5,5,5001,1,${30_000 * MS}}`);
    const retry = Math.ceil((7_500_000 + 10_000_000 - 7_142_857) / MS);
    at([20_000, 0, 7], 2, 5, 10, 22_500 * MS, `{0,7,3,7500,${retry},${30_000 * MS}}`);
    at(null, 2, 4, 3, 2_500 * MS, `{0,0,3,7500,7500,${10_000 * MS}}`);
    at([0, 0, 2], 2, 4, 3, 2_500 * MS, `{0,2,1,7500,17500,${10_000 * MS}}`);
    for (const [key, run, expected] of cases) expect([key, await run()]).toEqual([key, expected]);
    // A count past the safe range rejects, changing nothing.
    await slidingState('max', 0, 0, MAX, 2 * W);
    await expect(sliding(0, 'max', W, 1, 0, 0)).rejects.toThrow(/safe-integer range/);
    expect(await sliding(0, 'max', W, 0, 0, 0)).toBe(`{${MAX},10000,${W * MS}}`);
    await store.close();
  });

  it('rejects a sliding count past the safe range with ERR_COUNT_RANGE, changing nothing', async () => {
    const store = ownStore();
    const key = `swmax:${randomUUID()}`;
    await store.slidingWindow.increment(key, 3_600_000, Number.MAX_SAFE_INTEGER - 1);
    const error = await rejection(store.slidingWindow.increment(key, 3_600_000, 2));
    expect(error).toBeInstanceOf(RangeError);
    expect(error.code).toBe('ERR_COUNT_RANGE');
    expect((await store.slidingWindow.increment(key, 3_600_000, 0)).count).toBe(Number.MAX_SAFE_INTEGER - 1);
    await store.close();
  });

  it('calls made together go as one statement, in order, each answering its own result; a call the database refuses fails alone', async () => {
    const store = ownStore();
    const run = randomUUID();
    const hot = `batch:${run}`;
    const full = `batch-full:${run}`;
    await store.hit(full, 60_000, Number.MAX_SAFE_INTEGER - 1);
    await store.hit(`${hot}:warm`, 60_000, 1);
    const commits = async () =>
      Number(await own.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'"));
    const before = await commits();
    // One tick: hits on one key, every algorithm, a reset in the middle, one count past the safe range and
    // one key PostgreSQL's text can't hold (a NUL character).
    const calls = [
      ...Array.from({ length: 50 }, () => store.hit(hot, 60_000, 1)),
      store.slidingWindow.increment(hot, 60_000, 2),
      store.tokenBucket(hot, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 2 }),
      store.hit(full, 60_000, 2),
      store.hit(`nul:${run}\u0000`, 60_000, 1),
      ...Array.from({ length: 50 }, () => store.hit(hot, 60_000, 1)),
      store.consume(hot, { limit: 101, windowMs: 60_000, cost: 1 }),
    ];
    const settled = await Promise.allSettled(calls);
    const value = (i: number) => (settled[i] as PromiseFulfilledResult<any>).value;
    // In the order they were made, each seeing its own result.
    expect(Array.from({ length: 50 }, (_, i) => value(i).count)).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
    expect(value(50).count).toBe(2);
    expect(value(51).remaining).toBe(3);
    const range = (settled[52] as PromiseRejectedResult).reason;
    expect(range).toBeInstanceOf(RangeError);
    expect(range.code).toBe('ERR_COUNT_RANGE');
    const nul = (settled[53] as PromiseRejectedResult).reason;
    expect(nul.code).toBe('ERR_POSTGRES');
    expect(nul.message).not.toContain(run);
    expect(Array.from({ length: 50 }, (_, i) => value(54 + i).count)).toEqual(
      Array.from({ length: 50 }, (_, i) => i + 51),
    );
    expect(value(104)).toMatchObject({ allowed: true, count: 101 });
    expect((await store.hit(full, 60_000, 0)).count).toBe(Number.MAX_SAFE_INTEGER - 1);
    // Far fewer transactions than calls (the refused batch's calls are sent again one by one).
    await new Promise((resolve) => setTimeout(resolve, 700));
    expect((await commits()) - before).toBeLessThan(60);
    await store.close();
  });

  it("fixed-window hits made together go as one upsert of their keys: each answers its running count in call order, a key's window set by its first hit; a hit past the safe range fails alone", async () => {
    const store = ownStore();
    const run = randomUUID();
    const [a, b, full] = ['a', 'b', 'full'].map((k) => `hits:${run}:${k}`);
    const MAX = Number.MAX_SAFE_INTEGER;
    await store.hit(full, 60_000, MAX - 5);
    await store.hit(`hits:${run}:warm`, 60_000, 1);
    const commits = async () =>
      Number(await own.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'"));
    const before = await commits();
    // One tick: two keys hit in turn, a's amounts 1, 2, 3, 1, ...; then three hits that cross the safe range.
    const calls: Promise<{ count: number; resetMs: number }>[] = [];
    for (let i = 0; i < 100; i++) {
      calls.push(store.hit(a, i === 0 ? 60_000 : 5_000, 1 + (i % 3)));
      calls.push(store.hit(b, 30_000, 2));
    }
    calls.push(
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(a, 5_000, 1),
    );
    const settled = await Promise.allSettled(calls);
    const value = (i: number) => (settled[i] as PromiseFulfilledResult<{ count: number; resetMs: number }>).value;
    let running = 0;
    for (let i = 0; i < 100; i++) {
      running += 1 + (i % 3);
      expect(value(2 * i).count).toBe(running);
      expect(value(2 * i + 1).count).toBe(2 * (i + 1));
      // The window of a key's first hit: 60 s for a (not its later hits' 5 s), 30 s for b.
      expect(value(2 * i).resetMs).toBeGreaterThan(55_000);
      expect(value(2 * i).resetMs).toBeLessThanOrEqual(60_000);
      expect(value(2 * i + 1).resetMs).toBeGreaterThan(25_000);
      expect(value(2 * i + 1).resetMs).toBeLessThanOrEqual(30_000);
    }
    expect(value(200).count).toBe(MAX - 3);
    expect(value(201).count).toBe(MAX - 1);
    const range = (settled[202] as PromiseRejectedResult).reason;
    expect(range).toBeInstanceOf(RangeError);
    expect(range.code).toBe('ERR_COUNT_RANGE');
    expect(value(203).count).toBe(running + 1);
    expect((await store.hit(full, 60_000, 0)).count).toBe(MAX - 1);
    expect((await store.hit(a, 60_000, 0)).count).toBe(running + 1);
    expect((await store.hit(b, 60_000, 0)).count).toBe(200);
    // Far fewer transactions than calls (the refused batch's calls went again by key, then one by one).
    await new Promise((resolve) => setTimeout(resolve, 700));
    expect((await commits()) - before).toBeLessThan(30);
    await store.close();
  });

  it('a call made in a later turn never goes before the calls of an earlier turn, however many they were', async () => {
    const store = ownStore();
    const run = randomUUID();
    for (let round = 0; round < 5; round++) {
      const key = `later:${run}:${round}`;
      // One turn of 101 calls, the key's last; then, in the next turn, one more call on the key, alone.
      const earlier = [
        ...Array.from({ length: 100 }, (_, i) => store.hit(`${key}:other:${i}`, 60_000, 1)),
        store.hit(key, 60_000, 1),
      ];
      await Promise.resolve();
      const later = store.hit(key, 60_000, 1);
      expect([(await earlier[100]).count, (await later).count]).toEqual([1, 2]);
      await Promise.all(earlier);
    }
    await store.close();
  });

  it('calls made in one turn: a key with a lone surrogate fails alone with a TypeError, the others count in the order they were made', async () => {
    await loneSurrogatesMadeTogether(ownStore());
  });

  it('a reset made between hits applies between them, and a resetAll wipes only the calls made before it', async () => {
    const store = ownStore();
    const key = `order:${randomUUID()}`;
    const [a, , b, , c] = await Promise.all([
      store.hit(key, 60_000, 1),
      store.reset(key),
      store.hit(key, 60_000, 1),
      store.resetAll(),
      store.hit(key, 60_000, 1),
    ]);
    expect([a.count, b.count, c.count]).toEqual([1, 1, 1]);
    expect((await store.hit(key, 60_000, 0)).count).toBe(1);
    await store.close();
  });

  it('keeps the token bucket in TABLE_tb, and answers exactly as src/bucket.rs', async () => {
    const { table, store, sql, bucket } = await ownTables();
    const key = `tb:${randomUUID()}`;
    const p = { capacity: 5, refill: 1, intervalMs: 3_600_000 };
    const results = await Promise.all(Array.from({ length: 8 }, () => store.tokenBucket(key, p)));
    expect(results.filter((r) => r.allowed)).toHaveLength(5);
    expect(results.find((r) => !r.allowed)).toMatchObject({ remaining: 0, retryMs: expect.any(Number) });
    expect(await sql(`SELECT tokens FROM ${table}_tb WHERE key = '${key}'`)).toBe('0');
    expect(await store.tokenBucket(key, { ...p, cost: 0 })).toMatchObject({ allowed: true, remaining: 0 });
    const MS = 1000;
    // [allowed, remaining, retryMs, resetMs] at explicit times, from src/bucket.rs's tests.
    expect(await bucket('a', 10, 1, 1_000, 3, 5 * MS)).toBe('{1,7,0,3000}');
    expect(await bucket('b', 10, 3, 1_000, 10, 0)).toBe('{1,0,0,4000}');
    expect(await bucket('b', 10, 3, 1_000, 0, 999_999)).toBe('{1,0,0,3001}');
    expect(await bucket('b', 10, 3, 1_000, 0, 2_500 * MS)).toBe('{1,6,0,1500}');
    expect(await bucket('b', 10, 3, 1_000, 6, 2_500 * MS)).toBe('{1,0,0,3500}');
    expect(await sql(`SELECT at_us FROM ${table}_tb WHERE key = 'b'`)).toBe(String(2_000 * MS));
    expect(await bucket('c', 10, 2, 500, 9, 0)).toBe('{1,1,0,2500}');
    expect(await bucket('c', 10, 2, 500, 6, 100 * MS)).toBe('{0,1,1400,2400}');
    expect(await bucket('c', 10, 2, 500, 6, 1_500 * MS - 1)).toBe('{0,5,1,1001}');
    expect(await bucket('d', 3, 1, 1_000, 4, 0)).toBe('{0,3,1,0}');
    expect(await bucket('e', 3, 1, 1_000, 2, 0)).toBe('{1,1,0,2000}');
    expect(await bucket('e', 3, 1, 1_000, 4, 0)).toBe('{0,1,2000,2000}');
    await store.close();
  });

  it('reset(key) removes every state of the key; resetAll() empties every table', async () => {
    const { table, store, sql } = await ownTables();
    const key = `all:${randomUUID()}`;
    await store.hit(key, 60_000, 1);
    await store.slidingWindow.increment(key, 60_000);
    await store.tokenBucket(key, { capacity: 3, refill: 1, intervalMs: 60_000 });
    const rows = () =>
      sql(
        `SELECT (SELECT count(*) FROM ${table}) + (SELECT count(*) FROM ${table}_sw) + (SELECT count(*) FROM ${table}_tb)`,
      );
    expect(await rows()).toBe('3');
    await store.reset(key);
    expect(await rows()).toBe('0');
    await store.hit(key, 60_000, 1);
    await store.slidingWindow.increment(`${key}:2`, 60_000);
    await store.tokenBucket(`${key}:3`, { capacity: 3, refill: 1, intervalMs: 60_000 });
    await store.resetAll();
    expect(await rows()).toBe('0');
    await store.close();
  });

  it("with createTable false, runs on what docs/postgres.sql makes (the store's own DDL)", async () => {
    const table = `doc_${randomUUID().replace(/-/g, '')}`;
    const ddl = readFileSync(join(process.cwd(), 'docs', 'postgres.sql'), 'utf8').replaceAll('askdare_counters', table);
    await own.sql(ddl);
    const store = ownStore({ table, createTable: false });
    expect((await store.hit('k', 60_000, 2)).count).toBe(2);
    expect((await store.slidingWindow.increment('k', 60_000, 3)).count).toBe(3);
    expect((await store.tokenBucket('k', { capacity: 5, refill: 1, intervalMs: 1000, cost: 2 })).remaining).toBe(3);
    await store.close();
  });

  it('with createTable false and only the seed table, hits count (an upsert, alone or together), other calls reject naming the missing function; reset and resetAll work', async () => {
    const table = `only_${randomUUID().replace(/-/g, '')}`;
    await own.sql(`CREATE TABLE ${table} (key text PRIMARY KEY, total bigint NOT NULL, reset_at timestamptz NOT NULL)`);
    const store = ownStore({ table, createTable: false });
    expect((await store.hit('k', 60_000, 2)).count).toBe(2);
    expect(await own.sql(`SELECT total FROM ${table} WHERE key = 'k'`)).toBe('2');
    // Hits made together are one upsert of their keys: they count too.
    const together = await Promise.all([
      store.hit('k', 60_000, 1),
      store.hit('j', 60_000, 1),
      store.hit('k', 60_000, 1),
    ]);
    expect(together.map((r) => r.count)).toEqual([3, 1, 4]);
    // Both awaited at once: either may reject first.
    const calls = [
      store.consume(KEY_MARKER, { limit: 5, windowMs: 60_000 }),
      store.slidingWindow.increment(KEY_MARKER, 60_000),
    ];
    for (const error of await Promise.all(calls.map((call) => rejection(call)))) {
      expect(error.code).toBe('ERR_POSTGRES');
      expect(error.message).toContain('42883');
      expect(error.message).toContain('docs/postgres.sql');
    }
    await store.reset('k');
    await store.resetAll();
    await store.close();
  });

  it('creates the state tables and functions once when many stores start at once', async () => {
    const table = `race_${randomUUID().replace(/-/g, '')}`;
    const stores = Array.from({ length: 8 }, () => ownStore({ table }));
    const counts = await Promise.all(stores.map((store) => store.slidingWindow.increment('k', 3_600_000)));
    expect(counts.map((c) => c.count).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    const taken = await Promise.all(
      stores.map((store) => store.tokenBucket('k', { capacity: 4, refill: 1, intervalMs: 3_600_000 })),
    );
    expect(taken.filter((t) => t.allowed)).toHaveLength(4);
    await Promise.all(stores.map((store) => store.close()));
  });

  it('sweeps the rows that count nothing from every table, in batches, leaving the live ones (stats().swept)', async () => {
    const table = `sweep_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table, sweepIntervalMs: 200 });
    await store.ping();
    expect(
      await own.sql(
        `SELECT count(*) FROM pg_indexes WHERE indexname IN ('${table}_ix', '${table}_sw_ix', '${table}_tb_ix')`,
      ),
    ).toBe('3');
    const past = "now() - interval '1 second'";
    // More than two batches of ended windows, and expired states.
    await own.sql(`INSERT INTO ${table} SELECT 'old' || i, 1, ${past} FROM generate_series(1, 1200) i`);
    await own.sql(`INSERT INTO ${table}_sw SELECT 'old' || i, 0, 0, 1, ${past} FROM generate_series(1, 30) i`);
    await own.sql(`INSERT INTO ${table}_tb SELECT 'old' || i, 0, 0, ${past} FROM generate_series(1, 40) i`);
    await store.hit('live', 60_000, 1);
    await store.slidingWindow.increment('live', 60_000);
    await store.tokenBucket('live', { capacity: 2, refill: 1, intervalMs: 60_000 });
    const deadline = Date.now() + 15_000;
    while (store.stats().swept < 1270 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(store.stats().swept).toBe(1270);
    const left = await own.sql(
      `SELECT (SELECT count(*) FROM ${table}) || ',' || (SELECT count(*) FROM ${table}_sw) || ',' || (SELECT count(*) FROM ${table}_tb)`,
    );
    expect(left).toBe('1,1,1');
    expect((await store.hit('live', 60_000, 0)).count).toBe(1);
    await store.close();
    expect(store.stats().swept).toBe(1270);
  }, 30_000);

  it('with sweepIntervalMs 0 sweeps nothing; a bad interval is a RangeError', async () => {
    const table = `nosweep_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table, sweepIntervalMs: 0 });
    await store.ping();
    await own.sql(`INSERT INTO ${table} VALUES ('old', 1, now() - interval '1 second')`);
    await new Promise((r) => setTimeout(r, 400));
    expect(store.stats().swept).toBe(0);
    expect(await own.sql(`SELECT count(*) FROM ${table}`)).toBe('1');
    await store.close();
    expect(() => postgresStore({ sweepIntervalMs: -1 })).toThrow(RangeError);
    expect(() => postgresStore({ sweepIntervalMs: 1.5 })).toThrow(RangeError);
    expect(() => postgresStore({ sweepIntervalMs: '1' as unknown as number })).toThrow(TypeError);
  });

  it('says whether a failed call was sent: a refused connect was not (ERR_CONNECTION, sent false)', async () => {
    const port = await freePort();
    const store = postgresStore({
      url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`,
      timeoutMs: 3_000,
    });
    const error = (await rejection(store.hit(KEY_MARKER, 60_000, 1))) as Error & { code?: string; sent?: boolean };
    expect([error.code, error.sent]).toEqual(['ERR_CONNECTION', false]);
    expect(error.message).toContain('not sent');
    await store.close();
  });

  it('a call sent to a paused backend times out with sent true; a connect to a paused server with sent false', async () => {
    const store = ownStore({ url: `${own.url}?application_name=paused_backend`, timeoutMs: 500 });
    const key = `paused:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const pid = Number(
      await own.sql("SELECT pid FROM pg_stat_activity WHERE application_name = 'paused_backend' LIMIT 1"),
    );
    expect(pid).toBeGreaterThan(0);
    process.kill(pid, 'SIGSTOP');
    try {
      const error = (await rejection(store.hit(key, 60_000, 1))) as Error & { code?: string; sent?: boolean };
      expect([error.code, error.sent]).toEqual(['ERR_TIMEOUT', true]);
      expect(error.message).toContain('may or may not have counted');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    // Once the backend goes on, the paused hit either runs or is cancelled by the store's cancel request
    // (sent: it may or may not have counted), and it is never sent again: wait until that backend is
    // done with it, then the count is 1 or 2, never 3.
    for (let i = 0; i < 100; i++) {
      const active = await own.sql(`SELECT count(*) FROM pg_stat_activity WHERE pid = ${pid} AND state = 'active'`);
      if (active === '0') break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const settled = (await store.hit(key, 60_000, 0)).count;
    expect([1, 2]).toContain(settled);
    await store.close();
    const postmaster = Number(readFileSync(join(own.dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    const fresh = ownStore({ timeoutMs: 500 });
    process.kill(postmaster, 'SIGSTOP');
    try {
      const error = (await rejection(fresh.hit(key, 60_000, 1))) as Error & { code?: string; sent?: boolean };
      expect([error.code, error.sent]).toEqual(['ERR_TIMEOUT', false]);
      expect(error.message).toContain('not sent');
    } finally {
      process.kill(postmaster, 'SIGCONT');
    }
    await fresh.close();
    // The connect that was not sent counted nothing.
    expect((await ownStore().hit(key, 60_000, 0)).count).toBe(settled);
  }, 30_000);

  it('replaces a connection on which three statements in a row got no answer (a paused backend)', async () => {
    const name = `stuck_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ url: `${own.url}?application_name=${name}`, timeoutMs: 300 });
    const key = `stuck:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const backends = async () =>
      (await own.sql(`SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE application_name = '${name}'`))
        .split(',')
        .filter(Boolean);
    const [pid] = await backends();
    process.kill(Number(pid), 'SIGSTOP');
    try {
      for (let i = 0; i < 3; i++) {
        expect(await rejection(store.hit(key, 60_000, 1))).toMatchObject({ code: 'ERR_TIMEOUT', sent: true });
      }
      // A new connection answers while the old backend is still paused; the three sent hits wait there.
      // (On a loaded machine its connect may take longer than the 300 ms: such a call was not sent, and
      // the next one, once the back-off allows, connects again.)
      let answered: { count: number } | undefined;
      for (let i = 0; i < 200 && answered === undefined; i++) {
        try {
          answered = await store.hit(key, 60_000, 1);
        } catch (error) {
          expect(error).toMatchObject({ sent: false });
          await new Promise((r) => setTimeout(r, 50));
        }
      }
      expect(answered?.count).toBe(2);
      // The new connection and the paused one (a connect given up on may take a moment to leave).
      let live = await backends();
      for (let i = 0; i < 50 && live.length !== 2; i++) {
        await new Promise((r) => setTimeout(r, 20));
        live = await backends();
      }
      expect(live.length).toBe(2);
    } finally {
      process.kill(Number(pid), 'SIGCONT');
    }
    // Resumed, the old backend runs what it was sent: each sent hit counted once, none sent again.
    let count = 0;
    for (let i = 0; i < 100 && count !== 5; i++) {
      count = (await store.hit(key, 60_000, 0)).count;
      if (count !== 5) await new Promise((r) => setTimeout(r, 20));
    }
    expect(count).toBe(5);
    await store.close();
  }, 30_000);

  it('follows DNS that moves: a new connection resolves the host name again', async () => {
    // Two servers on one port, at 127.0.0.1 and 127.0.0.2, and a store in a child process whose
    // /etc/hosts (a file of the test's, bind-mounted in a mount namespace of its own) names one, then the other.
    const moved = await startPostgres({ host: '127.0.0.2', port: own.port });
    const dir = mkdtempSync(join(tmpdir(), 'ratestore-dns-'));
    const hosts = join(dir, 'hosts');
    const name = 'pg-moves.ratestore.test';
    writeFileSync(hosts, `127.0.0.1 ${name}\n`);
    const app = `dns_${randomUUID().replace(/-/g, '')}`;
    const url = `postgres://postgres:${PASSWORD}@${name}:${own.port}/postgres?application_name=${app}`;
    const script = join(__dirname, 'fixtures', 'pg-dns-child.js');
    // As root a mount namespace; else a user namespace too, in which the caller may mount.
    const unshare = userInfo().uid === 0 ? ['-m'] : ['-rm'];
    const child = spawn(
      'unshare',
      [
        ...unshare,
        'sh',
        '-c',
        'mount --bind "$1" /etc/hosts && exec "$2" "$3" "$4"',
        'sh',
        hosts,
        process.execPath,
        script,
        url,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    const answers = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    const hit = async (key: string) => {
      child.stdin!.write(`${key}\n`);
      const next = await answers.next();
      if (next.done) throw new Error('the child process ended (unshare and mount --bind need root or user namespaces)');
      return JSON.parse(next.value) as { count?: number; code?: string };
    };
    const key = `dns:${randomUUID()}`;
    const total = async (server: { sql(s: string): Promise<string> }) =>
      server.sql(`SELECT coalesce((SELECT total FROM askdare_counters WHERE key = '${key}'), 0)`);
    try {
      expect(await hit(key)).toEqual({ count: 1 });
      expect(await total(own)).toBe('1');
      // The name moves; the connection to the old address is lost.
      writeFileSync(hosts, `127.0.0.2 ${name}\n`);
      await own.sql(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '${app}'`);
      let answer = await hit(key);
      for (let i = 0; i < 20 && answer.count === undefined; i++) {
        expect(answer.code).toMatch(/^ERR_(CONNECTION|TIMEOUT)$/);
        await new Promise((r) => setTimeout(r, 100));
        answer = await hit(key);
      }
      // Counted on the server the name now names; the old one kept its count.
      expect(answer).toEqual({ count: 1 });
      expect(await total(moved)).toBe('1');
      expect(await total(own)).toBe('1');
    } finally {
      child.stdin!.end();
      await new Promise((resolve) => child.once('exit', resolve));
      await moved.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it('backs off after a failed connect: calls reject at once, unsent, then one call alone connects', async () => {
    // A TCP proxy in front of the server counts the store's connects.
    let connects = 0;
    const proxy = createServer((socket) => {
      connects++;
      const upstream = connect(own.port, '127.0.0.1');
      socket.pipe(upstream).pipe(socket);
      upstream.on('error', () => socket.destroy());
      socket.on('error', () => upstream.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const port = (proxy.address() as AddressInfo).port;
    const timeoutMs = 1_000;
    const store = postgresStore({ url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`, timeoutMs });
    const key = `backoff:${randomUUID()}`;
    type Failure = Error & { code?: string; sent?: boolean };
    /** `n` calls at once: their errors (or undefined) and how long the slowest took. */
    const burst = async (n: number) => {
      const started = Date.now();
      const results = await Promise.all(
        Array.from({ length: n }, () =>
          store.hit(key, 60_000, 1).then(
            () => undefined,
            (e: Failure) => e,
          ),
        ),
      );
      return { results, ms: Date.now() - started };
    };
    try {
      expect((await store.hit(key, 60_000, 1)).count).toBe(1);
      expect(connects).toBe(1);
      await own.halt();
      try {
        // The lost connection, then a failed connect.
        await store.hit(key, 60_000, 1).catch(() => undefined);
        const before = connects;
        const first = await rejection(store.hit(key, 60_000, 1));
        expect(first.code).toBe('ERR_CONNECTION');
        const failedConnects = connects - before;
        expect(failedConnects).toBeLessThanOrEqual(1);
        // Backing off: a burst rejects at once, unsent, and tries no connect.
        const atOnce = connects;
        const refused = await burst(20);
        expect(refused.ms).toBeLessThan(200);
        expect(connects).toBe(atOnce);
        for (const e of refused.results) {
          expect(e).toBeDefined();
          expect([e!.code, e!.sent]).toEqual(['ERR_CONNECTION', false]);
          expect(e!.message).toContain('backing off');
          for (const secret of [KEY_MARKER, PASSWORD, 'postgres://']) expect(e!.message).not.toContain(secret);
        }
        // After the delay (at most 100 ms after one failure, 200 after two), one call of a burst connects.
        await new Promise((r) => setTimeout(r, 250));
        const probing = connects;
        const probe = await burst(20);
        expect(connects - probing).toBe(1);
        expect(probe.ms).toBeLessThan(timeoutMs);
        expect(probe.results.every((e) => e?.code === 'ERR_CONNECTION' && e.sent === false)).toBe(true);
      } finally {
        await own.start();
      }
      // Back up: after the last delay (at most 400 ms), calls connect once and count exactly.
      await new Promise((r) => setTimeout(r, 500));
      const up = connects;
      const hits = await Promise.all(Array.from({ length: 10 }, () => store.hit(key, 60_000, 1)));
      expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual([2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
      expect(connects - up).toBe(1);
    } finally {
      await store.close();
      await new Promise((resolve) => proxy.close(resolve));
    }
  }, 30_000);

  /** Holds `key`'s row of askdare_counters locked from another session for `ms`; resolves once it is held. */
  async function holdRow(key: string, ms: number): Promise<{ released: Promise<string> }> {
    const tag = `hold_${randomUUID().replace(/-/g, '')}`;
    const done = own.sql(
      `SET application_name = '${tag}'; BEGIN; SELECT 1 FROM askdare_counters WHERE key = '${key}' FOR UPDATE; ` +
        `SELECT pg_sleep(${ms / 1000}); COMMIT`,
    );
    for (let i = 0; i < 200; i++) {
      const held = await own.sql(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${tag}' AND wait_event = 'PgSleep'`,
      );
      if (Number(held) > 0) return { released: done };
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error('the row lock was not taken');
  }

  it('statement_timeout cancels a call waiting on a locked row: ERR_TIMEOUT, sent true, nothing counted; the store works after', async () => {
    // The store's session has statement_timeout = 300 ms (PostgreSQL's own, through the URL's options).
    const store = ownStore({ url: `${own.url}?options=-c%20statement_timeout%3D300`, timeoutMs: 5_000 });
    const key = `stmt-timeout:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const { released } = await holdRow(key, 1_500);
    const started = Date.now();
    const error = (await rejection(store.hit(key, 60_000, 1))) as Error & { code?: string; sent?: boolean };
    expect(Date.now() - started).toBeLessThan(1_400);
    expect(error.code).toBe('ERR_TIMEOUT');
    expect(error.sent).toBe(true);
    expect(error.message).toContain('57014');
    expect(error.message).toContain('counted nothing');
    await released;
    // The cancelled hit was rolled back; the connection serves the next call.
    expect((await store.hit(key, 60_000, 1)).count).toBe(2);
    await store.close();
  }, 30_000);

  it('a call on a row locked past timeoutMs rejects with ERR_TIMEOUT, sent true, counting nothing; the store works after', async () => {
    // The store's lock_timeout is a quarter of timeoutMs (750 ms): its error has 2.25 s to come back
    // before timeoutMs, on a loaded machine too.
    const store = ownStore({ timeoutMs: 3_000 });
    const key = `lock-timeout:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const { released } = await holdRow(key, 3_500);
    const started = Date.now();
    const error = (await rejection(store.hit(key, 60_000, 1))) as Error & { code?: string; sent?: boolean };
    expect(Date.now() - started).toBeLessThan(3_400);
    expect(error).toMatchObject({ code: 'ERR_TIMEOUT', sent: true });
    // The store's own lock_timeout ended its wait before timeoutMs: PostgreSQL rolled the call back.
    expect(error.message).toContain('counted nothing');
    await released;
    // It is not sent again, and counted nothing.
    expect((await store.hit(key, 60_000, 1)).count).toBe(2);
    await store.close();
  }, 30_000);

  it('a read-only server (25006, as a demoted primary) rejects with ERR_POSTGRES; writable again, the store connects anew', async () => {
    const name = `ro_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ url: `${own.url}?application_name=${name}` });
    const key = `read-only:${randomUUID()}`;
    const backend = () =>
      own.sql(`SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE application_name = '${name}'`);
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const before = await backend();
    expect(before).toMatch(/^\d+$/);
    try {
      await own.sql('ALTER SYSTEM SET default_transaction_read_only = on');
      await own.sql('SELECT pg_reload_conf()');
      // The store's session sees the reloaded setting on its next statement.
      let error: (Error & { code?: string }) | undefined;
      for (let i = 0; i < 50 && !error; i++) {
        error = await store.hit(key, 60_000, 1).then(
          () => undefined,
          (e: Error & { code?: string }) => e,
        );
        if (!error) await new Promise((r) => setTimeout(r, 20));
      }
      expect(error).toBeDefined();
      expect(error!.code).toBe('ERR_POSTGRES');
      expect(error!.message).toContain('25006');
      for (const secret of [KEY_MARKER, PASSWORD, 'postgres://']) expect(error!.message).not.toContain(secret);
      // While read-only, every write rejects the same way (a new connection's set-up included).
      expect((await rejection(store.hit(key, 60_000, 1))).message).toContain('25006');
    } finally {
      await own.sql('ALTER SYSTEM RESET default_transaction_read_only');
      await own.sql('SELECT pg_reload_conf()');
    }
    const counted = Number(await own.sql(`SELECT total FROM askdare_counters WHERE key = '${key}'`));
    // The failed set-up of a new connection while read-only started the backoff (at most 100 ms).
    await new Promise((r) => setTimeout(r, 150));
    expect((await store.hit(key, 60_000, 1)).count).toBe(counted + 1);
    // The connection that met 25006 was replaced by a new one.
    const after = await backend();
    expect(after).toMatch(/^\d+$/);
    expect(after).not.toBe(before);
    await store.close();
  }, 30_000);

  /** Holds `key`'s row of `table` locked from another session for `ms`; resolves once it is held. */
  async function holdRowOf(table: string, key: string, ms: number): Promise<{ released: Promise<string> }> {
    const tag = `hold_${randomUUID().replace(/-/g, '')}`;
    const done = own.sql(
      `SET application_name = '${tag}'; BEGIN; SELECT 1 FROM ${table} WHERE key = '${key}' FOR UPDATE; ` +
        `SELECT pg_sleep(${ms / 1000}); COMMIT`,
    );
    for (let i = 0; i < 200; i++) {
      const held = await own.sql(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${tag}' AND wait_event = 'PgSleep'`,
      );
      if (Number(held) > 0) return { released: done };
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error('the row lock was not taken');
  }

  it("a row another session holds stalls only its key: other keys answer within timeoutMs, the key's calls fail within it, sent and counting nothing; at most 2 backends, none left waiting", async () => {
    const table = `held_${randomUUID().replace(/-/g, '')}`;
    const app = `held_${randomUUID().replace(/-/g, '')}`;
    const timeoutMs = 1_000;
    const store = ownStore({ table, url: `${own.url}?application_name=${app}`, timeoutMs });
    const W = 3_600_000;
    await store.hit('X', W, 1);
    // A first stall opens the second connection (a debug build's SCRAM login holds the one I/O thread
    // for about half a second), before anything is timed.
    const warm = await holdRowOf(table, 'X', 1_500);
    const warmed = await store.hit('X', W, 1).then(
      () => 1,
      () => 0,
    );
    await warm.released;
    const { released } = await holdRowOf(table, 'X', 4_500);
    const backends = () =>
      own.sql(`SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}'`).then(Number);
    type Outcome = { key: string; ms: number; error?: Error & { code?: string; sent?: boolean } };
    const outcomes: Outcome[] = [];
    const until = Date.now() + 2_200;
    let most = 0;
    const lane = async (n: number) => {
      for (let i = 0; Date.now() < until; i++) {
        const key = i % 4 === n % 4 ? 'X' : `other:${(n * 7 + i) % 20}`;
        const started = Date.now();
        const error = await store.hit(key, W, 1).then(
          () => undefined,
          (e: Outcome['error']) => e,
        );
        outcomes.push({ key, ms: Date.now() - started, error });
      }
    };
    const watch = (async () => {
      while (Date.now() < until) {
        most = Math.max(most, await backends());
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    await Promise.all([...Array.from({ length: 16 }, (_, n) => lane(n)), watch]);
    const others = outcomes.filter((o) => o.key !== 'X');
    const onX = outcomes.filter((o) => o.key === 'X');
    expect(others.length).toBeGreaterThan(50);
    expect(others.filter((o) => o.error).map((o) => o.error!.message)).toEqual([]);
    // Generous bounds: the CPU is shared.
    expect(Math.max(...others.map((o) => o.ms))).toBeLessThan(timeoutMs);
    expect(onX.length).toBeGreaterThan(0);
    for (const o of onX) {
      // Sent (it waited on the lock, and was rolled back), or, on a busy machine, timed out still
      // queued for the second connection (not sent): either way it counted nothing, as the row's
      // total below shows.
      expect(o.error?.code).toBe('ERR_TIMEOUT');
      expect(typeof o.error?.sent).toBe('boolean');
      expect(o.ms).toBeLessThan(timeoutMs + 150);
    }
    expect(onX.filter((o) => o.error!.message.includes('counted nothing')).length).toBeGreaterThan(0);
    expect(most).toBeLessThanOrEqual(2);
    await released;
    // None of the store's backends still waits on the lock; the calls told they failed counted nothing.
    expect(
      await own.sql(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}' AND wait_event_type = 'Lock'`,
      ),
    ).toBe('0');
    expect(await own.sql(`SELECT total FROM ${table} WHERE key = 'X'`)).toBe(String(1 + warmed));
    expect((await store.hit('X', W, 1)).count).toBe(2 + warmed);
    const answered = others.length;
    expect(Number(await own.sql(`SELECT sum(total) FROM ${table} WHERE key <> 'X'`))).toBe(answered);
    await store.close();
  }, 30_000);

  it("a fleet: 3 processes x 40 in flight of askdare's pattern on shared keys for 10 s: no failure, every count exact", async () => {
    const table = `fleet_${randomUUID().replace(/-/g, '')}`;
    const { reports, sums } = await fleet(own.url, table, 3, 40, 10_000);
    expect(reports.map((r) => [r.failed, r.failures])).toEqual(reports.map(() => [0, {}]));
    expect(reports.reduce((n, r) => n + r.requests, 0)).toBeGreaterThan(300);
    expect(await totals(own.sql, table)).toEqual(sums);
  }, 60_000);

  it('under a repeatable read or serializable default, stores on shared keys in every order count exactly', async () => {
    for (const level of ['repeatable%5C%20read', 'serializable']) {
      const table = `iso_${randomUUID().replace(/-/g, '')}`;
      const url = `${own.url}?options=-c%20default_transaction_isolation%3D${level}`;
      const stores = Array.from({ length: 4 }, () => ownStore({ table, url }));
      // Each store goes through the keys in an order of its own.
      const orders = ['abcd', 'dcba', 'badc', 'cadb'];
      const calls = stores.flatMap((s, n) =>
        Array.from({ length: 60 }, (_, i) => s.hit(orders[n][i % 4], 3_600_000, 1)),
      );
      const settled = await Promise.allSettled(calls);
      expect(settled.filter((r) => r.status === 'rejected').map((r) => String(r.reason))).toEqual([]);
      expect(await totals(own.sql, table)).toEqual({ a: 60, b: 60, c: 60, d: 60 });
      await Promise.all(stores.map((s) => s.close()));
    }
  }, 30_000);

  it('keys of any length up to 1 MiB count apart, in a batch with short keys; a long key is stored by its SHA-256', async () => {
    const table = `long_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table });
    const long = (tail: string) => `${'k'.repeat(5_000)}${tail}`;
    const calls = [
      store.hit('short', 60_000, 1),
      store.hit(long('a'), 60_000, 1),
      store.hit(long('b'), 60_000, 2),
      store.hit('\u00e9'.repeat(600_000), 60_000, 3),
      store.hit(long('a'), 60_000, 1),
      store.hit('short', 60_000, 1),
    ];
    expect((await Promise.all(calls)).map((h) => h.count)).toEqual([1, 1, 2, 3, 2, 2]);
    await store.reset(long('a'));
    expect((await store.hit(long('a'), 60_000, 0)).count).toBe(0);
    expect((await store.hit(long('b'), 60_000, 0)).count).toBe(2);
    expect(Number(await own.sql(`SELECT max(octet_length(key)) FROM ${table}`))).toBeLessThan(1_100);
    await store.close();
  });

  it('with a schema named after the user, counts carry on in the table the search path finds (no second table)', async () => {
    const table = `user_${randomUUID().replace(/-/g, '')}`;
    await own.sql(`CREATE TABLE public.${table} (key text PRIMARY KEY, total bigint NOT NULL, reset_at timestamptz NOT NULL);
      INSERT INTO public.${table} VALUES ('k', 500, now() + interval '1 hour')`);
    await own.sql('CREATE SCHEMA postgres');
    try {
      const store = ownStore({ table });
      expect((await store.hit('k', 3_600_000, 1)).count).toBe(501);
      expect((await store.slidingWindow.increment('k', 60_000)).count).toBe(1);
      expect(await own.sql(`SELECT count(*) FROM pg_tables WHERE schemaname = 'postgres'`)).toBe('0');
      expect(await own.sql(`SELECT total FROM public.${table} WHERE key = 'k'`)).toBe('501');
      await store.close();
    } finally {
      await own.sql('DROP SCHEMA postgres CASCADE');
    }
  });

  it('a refund, read or consume of a row past 2^53 rejects with ERR_COUNT_RANGE, changing nothing', async () => {
    const table = `big_${randomUUID().replace(/-/g, '')}`;
    const store = ownStore({ table });
    await store.ping();
    const big = '9007199254741000';
    await own.sql(`INSERT INTO ${table} VALUES ('big', ${big}, now() + interval '1 hour')`);
    const calls = [
      store.refund('big', 1),
      store.hit('big', 3_600_000, 0),
      store.consume('big', { limit: 5, windowMs: 3_600_000 }),
      store.hit('fine', 3_600_000, 1),
    ];
    const settled = await Promise.allSettled(calls);
    for (const r of settled.slice(0, 3)) {
      expect(r.status).toBe('rejected');
      expect((r as PromiseRejectedResult).reason).toBeInstanceOf(RangeError);
      expect((r as PromiseRejectedResult).reason.code).toBe('ERR_COUNT_RANGE');
    }
    expect(settled[3]).toMatchObject({ status: 'fulfilled', value: { count: 1 } });
    expect(await rejection(store.refund('big', 1))).toMatchObject({ code: 'ERR_COUNT_RANGE' });
    expect(await own.sql(`SELECT total FROM ${table} WHERE key = 'big'`)).toBe(big);
    await store.close();
  });

  it('a failed set-up is not sent: a refused login (28P01, 53300) or a statement_timeout while setting up rejects sent false', async () => {
    const wrong = postgresStore({ url: own.url.replace(PASSWORD, 'wrong-secret-7d1f'), timeoutMs: 3_000 });
    expect(await rejection(wrong.hit(KEY_MARKER, 60_000, 1))).toMatchObject({ code: 'ERR_AUTH', sent: false });
    const role = `limited_${randomUUID().replace(/-/g, '')}`;
    await own.sql(`CREATE ROLE ${role} LOGIN PASSWORD '${PASSWORD}' CONNECTION LIMIT 0`);
    const limited = postgresStore({ url: own.url.replace('//postgres:', `//${role}:`), timeoutMs: 3_000 });
    const full = await rejection(limited.hit(KEY_MARKER, 60_000, 1));
    expect([full.code, (full as { sent?: boolean }).sent]).toEqual(['ERR_POSTGRES', false]);
    expect(full.message).toContain('53300');
    // The set-up waits for the advisory lock another session holds, and statement_timeout cancels it.
    const table = `setup_${randomUUID().replace(/-/g, '')}`;
    const tag = `lock_${randomUUID().replace(/-/g, '')}`;
    const held = own.sql(
      `SET application_name = '${tag}'; SELECT pg_advisory_lock(hashtext('ratestore:"${table}"')), ` +
        `pg_advisory_lock(hashtext('ratestore:"public"."${table}"')), pg_sleep(1.5)`,
    );
    for (let i = 0; i < 200; i++) {
      const n = await own.sql(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${tag}' AND wait_event = 'PgSleep'`,
      );
      if (n === '1') break;
      await new Promise((r) => setTimeout(r, 10));
    }
    const slow = postgresStore({ url: `${own.url}?options=-c%20statement_timeout%3D200`, table, timeoutMs: 3_000 });
    const cancelled = await rejection(slow.hit(KEY_MARKER, 60_000, 1));
    expect([cancelled.code, (cancelled as { sent?: boolean }).sent]).toEqual(['ERR_TIMEOUT', false]);
    await held;
    await Promise.all([wrong.close(), limited.close(), slow.close()]);
  });

  it('a table name means itself whatever standard_conforming_strings says; timeoutMs of 2^32 or more is a RangeError', async () => {
    const table = `q\\'_${randomUUID().replace(/-/g, '').slice(0, 8)}`;
    const url = `${own.url}?options=-c%20standard_conforming_strings%3Doff`;
    const store = ownStore({ table, url });
    expect((await store.hit('k', 60_000, 1)).count).toBe(1);
    expect((await store.slidingWindow.increment('k', 60_000)).count).toBe(1);
    expect((await store.hit('k', 60_000, 1)).count).toBe(2);
    expect(await own.sql(`SELECT count(*) FROM pg_tables WHERE tablename = '${table.replace("'", "''")}'`)).toBe('1');
    await store.close();
    expect(() => postgresStore({ timeoutMs: 2 ** 32 })).toThrow(RangeError);
    expect(() => postgresStore({ timeoutMs: 2 ** 40 })).toThrow(RangeError);
  });

  it('keys mean themselves whatever standard_conforming_strings says: alone (the prepared upsert and functions, their arguments sent as literals) and in a batch', async () => {
    const keys = ["a'b", "c\\'d", '\\x27\\', "e''", "'); DELETE FROM x; --", 'é😀\u0001', '$1 {x,y} "q" NULL', ''];
    const hex = (list: string[]) =>
      list
        .map((k) => Buffer.from(k, 'utf8').toString('hex'))
        .sort()
        .join(',');
    for (const off of [false, true]) {
      const table = `lit_${randomUUID().replace(/-/g, '')}`;
      const url = off ? `${own.url}?options=-c%20standard_conforming_strings%3Doff` : own.url;
      const store = ownStore({ table, url });
      // One at a time: each alone; then all at once: one batch.
      for (const key of keys) expect((await store.hit(key, 60_000, 2)).count).toBe(2);
      const together = await Promise.all(keys.map((key) => store.hit(key, 60_000, 1)));
      expect(together.map((r) => r.count)).toEqual(keys.map(() => 3));
      for (const key of keys) {
        expect(await store.consume(key, { limit: 4, windowMs: 60_000 })).toMatchObject({ allowed: true, count: 4 });
      }
      expect(
        await own.sql(
          `SELECT string_agg(encode(convert_to(key, 'UTF8'), 'hex'), ',' ORDER BY encode(convert_to(key, 'UTF8'), 'hex') COLLATE "C") FROM ${table}`,
        ),
      ).toBe(hex(keys));
      expect(await own.sql(`SELECT DISTINCT total FROM ${table}`)).toBe('4');
      await store.close();
    }
  });

  it('the call-by-call retry after a refused batch is pipelined: over a slow link, 400 calls with one past the safe range answer in time', async () => {
    // A TCP proxy that holds each chunk 10 ms each way.
    const proxy = createServer((socket) => {
      const upstream = connect(own.port, '127.0.0.1');
      const delayed = (from: NodeJS.ReadableStream, to: NodeJS.WritableStream) =>
        from.on('data', (chunk) => setTimeout(() => to.write(chunk), 10));
      delayed(socket, upstream);
      delayed(upstream, socket);
      upstream.on('error', () => socket.destroy());
      socket.on('error', () => upstream.destroy());
      upstream.on('close', () => socket.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const port = (proxy.address() as AddressInfo).port;
    const table = `slow_${randomUUID().replace(/-/g, '')}`;
    const store = postgresStore({
      url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`,
      table,
      timeoutMs: 2_000,
    });
    try {
      await store.hit('full', 60_000, Number.MAX_SAFE_INTEGER - 1);
      const calls = Array.from({ length: 400 }, (_, i) =>
        i === 200 ? store.hit('full', 60_000, 2) : store.hit(`k${i % 50}`, 60_000, 1),
      );
      const settled = await Promise.allSettled(calls);
      const rejected = settled.flatMap((r, i) => (r.status === 'rejected' ? [[i, r.reason.code]] : []));
      expect(rejected).toEqual([[200, 'ERR_COUNT_RANGE']]);
      expect(Number(await own.sql(`SELECT sum(total) FROM ${table} WHERE key <> 'full'`))).toBe(399);
    } finally {
      await store.close();
      await new Promise((resolve) => proxy.close(resolve));
    }
  }, 30_000);

  it("sweeps off the hits' connection: a sweep that waits on a table lock stalls no hit; a seed table without an index on reset_at is swept in page ranges", async () => {
    const table = `seedsweep_${randomUUID().replace(/-/g, '')}`;
    // Seed 000's table, as its SQL makes it: no index on reset_at.
    await own.sql(`CREATE TABLE ${table} (key text PRIMARY KEY, total bigint NOT NULL, reset_at timestamptz NOT NULL);
      INSERT INTO ${table} SELECT 'live' || i, 1, now() + interval '1 hour' FROM generate_series(1, 50000) i;
      INSERT INTO ${table} SELECT 'old' || i, 1, now() - interval '1 second' FROM generate_series(1, 300) i`);
    const store = ownStore({ table, sweepIntervalMs: 200, timeoutMs: 1_000 });
    await store.ping();
    // Another session holds the bucket table in SHARE mode: the sweep's DELETE there waits.
    const tag = `share_${randomUUID().replace(/-/g, '')}`;
    const held = own.sql(
      `SET application_name = '${tag}'; BEGIN; LOCK TABLE ${table}_tb IN SHARE MODE; SELECT pg_sleep(3); COMMIT`,
    );
    const failures: string[] = [];
    const until = Date.now() + 2_500;
    let hits = 0;
    while (Date.now() < until) {
      await Promise.all(
        Array.from({ length: 4 }, (_, i) =>
          store.hit(`hot${i}`, 3_600_000, 1).then(
            () => void hits++,
            (e: Error) => void failures.push(e.message),
          ),
        ),
      );
    }
    await held;
    expect(failures).toEqual([]);
    expect(store.stats().swept).toBe(300);
    expect(await own.sql(`SELECT count(*) FROM ${table} WHERE reset_at < now()`)).toBe('0');
    expect(Number(await own.sql(`SELECT sum(total) FROM ${table} WHERE key LIKE 'hot%'`))).toBe(hits);
    await store.close();
  }, 60_000);

  it('refuses calls after close() with ERR_CLOSED', async () => {
    const store = ownStore();
    await store.close();
    expect((await rejection(store.hit('k', 60_000, 1))).code).toBe('ERR_CLOSED');
  });
});

describe("postgresStore through PgBouncer in transaction mode (Debian's pgbouncer, 2 server connections)", () => {
  let pgServer: PostgresServer;
  let bouncer: Pgbouncer;
  const POOL = 2;
  beforeAll(async () => {
    pgServer = await startPostgres();
    bouncer = await startPgbouncer(pgServer, POOL);
  }, 120_000);
  afterAll(async () => {
    await bouncer?.stop();
    await pgServer?.stop();
  });
  const table = `bouncer_${randomUUID().replace(/-/g, '')}`;
  const store = () => postgresStore({ url: bouncer.url, table, timeoutMs: 10_000 });
  /** Client backends on the server (psql's own excluded): PgBouncer's server connections. */
  const backends = async () =>
    Number(
      await pgServer.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
      ),
    );

  it('runs every operation through it, answering as on the server itself', async () => {
    const s = store();
    const key = `all:${randomUUID()}`;
    expect(await s.ping()).toBeUndefined();
    expect((await s.hit(key, 60_000, 2)).count).toBe(2);
    expect(await s.consume(key, { limit: 3, windowMs: 60_000 })).toMatchObject({ allowed: true, count: 3 });
    expect(await s.consume(key, { limit: 3, windowMs: 60_000 })).toMatchObject({ allowed: false, count: 3 });
    await s.refund(key, 1);
    expect((await s.hit(key, 60_000, 0)).count).toBe(2);
    const first = await s.slidingWindow.increment(key, 60_000, 2);
    expect(first.count).toBe(2);
    expect((await s.slidingWindow.decrement(key, 60_000, 1, { window: first.window })).count).toBe(1);
    expect(await s.slidingWindow.consume(key, { limit: 2, windowMs: 60_000 })).toMatchObject({ allowed: true });
    expect(await s.slidingWindow.consume(key, { limit: 2, windowMs: 60_000 })).toMatchObject({ allowed: false });
    const p = { capacity: 2, refill: 1, intervalMs: 3_600_000 };
    expect(await s.tokenBucket(key, p)).toMatchObject({ allowed: true, remaining: 1 });
    expect(await s.tokenBucket(key, { ...p, cost: 2 })).toMatchObject({ allowed: false, remaining: 1 });
    await s.reset(key);
    expect((await s.hit(key, 60_000, 0)).count).toBe(0);
    expect(await s.tokenBucket(key, p)).toMatchObject({ allowed: true, remaining: 1 });
    await s.resetAll();
    expect(await pgServer.sql(`SELECT count(*) FROM ${table}_tb`)).toBe('0');
    await s.close();
  }, 30_000);

  it("a fleet through it: 3 processes x 40 in flight of askdare's pattern on shared keys for 10 s: no failure, every count exact", async () => {
    const table = `bfleet_${randomUUID().replace(/-/g, '')}`;
    const { reports, sums } = await fleet(bouncer.url, table, 3, 40, 10_000);
    expect(reports.map((r) => [r.failed, r.failures])).toEqual(reports.map(() => [0, {}]));
    expect(reports.reduce((n, r) => n + r.requests, 0)).toBeGreaterThan(100);
    expect(await totals(pgServer.sql, table)).toEqual(sums);
    // (A psql session of the checks above may still be leaving the server: a moment for it to go.)
    let live = await backends();
    for (let i = 0; i < 50 && live > POOL; i++) {
      await new Promise((r) => setTimeout(r, 20));
      live = await backends();
    }
    expect(live).toBeLessThanOrEqual(POOL);
  }, 60_000);

  it('counts exactly under concurrent calls from several stores sharing 2 server connections', async () => {
    const stores = Array.from({ length: 6 }, store);
    const key = `many:${randomUUID()}`;
    const per = 50;
    // Every store connected at once: PgBouncer holds 6 client connections on at most 2 of the server's.
    await Promise.all(stores.map((s) => s.ping()));
    const hits = await Promise.all(stores.flatMap((s) => Array.from({ length: per }, () => s.hit(key, 60_000, 1))));
    // Each hit saw its own count: 1..300, each once.
    expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual(
      Array.from({ length: stores.length * per }, (_, i) => i + 1),
    );
    expect(await backends()).toBeLessThanOrEqual(POOL);
    expect((await stores[0].hit(key, 60_000, 0)).count).toBe(stores.length * per);
    const allowed = async (calls: Promise<{ allowed: boolean }>[]) =>
      (await Promise.all(calls)).filter((r) => r.allowed).length;
    const each = <T>(fn: (s: (typeof stores)[number]) => Promise<T>) =>
      stores.flatMap((s) => Array.from({ length: 20 }, () => fn(s)));
    expect(await allowed(each((s) => s.consume(`c:${key}`, { limit: 50, windowMs: 60_000 })))).toBe(50);
    expect(await allowed(each((s) => s.slidingWindow.consume(`sw:${key}`, { limit: 30, windowMs: 60_000 })))).toBe(30);
    expect(
      await allowed(each((s) => s.tokenBucket(`tb:${key}`, { capacity: 40, refill: 1, intervalMs: 3_600_000 }))),
    ).toBe(40);
    expect(await backends()).toBeLessThanOrEqual(POOL);
    await Promise.all(stores.map((s) => s.close()));
  }, 60_000);
});

describe('postgresStore over TLS (a server with ssl=on that accepts TLS connections only)', () => {
  let tlsServer: PostgresServer;
  let certDir: string;
  let ca: string;
  beforeAll(async () => {
    certDir = mkdtempSync(join(tmpdir(), 'ratestore-pg-tls-'));
    const files = await makeCertificates(certDir);
    ca = readFileSync(files.ca, 'utf8');
    tlsServer = await startPostgres({ tls: files });
  }, 120_000);
  afterAll(async () => {
    await tlsServer?.stop();
    if (certDir) rmSync(certDir, { recursive: true, force: true });
  });

  /** The URL with these query parameters. */
  const url = (query: string) => `${tlsServer.url}?${query}`;
  /** Whether the server sees a TLS connection of this application name. */
  const overTls = (name: string) =>
    tlsServer.sql(
      `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.application_name = '${name}'`,
    );

  it('sslmode=require (from the URL) connects over TLS, checking no certificate', async () => {
    const store = postgresStore({ url: url('sslmode=require&application_name=tls_require'), timeoutMs: 5_000 });
    expect((await store.hit(`tls:${randomUUID()}`, 60_000, 2)).count).toBe(2);
    expect(await overTls('tls_require')).toBe('1');
    await store.close();
  });

  it('logs in with SCRAM channel binding over TLS (channel_binding=require), the certificate unchecked', async () => {
    const store = postgresStore({ url: url('sslmode=require&channel_binding=require'), timeoutMs: 5_000 });
    expect((await store.hit(`bound:${randomUUID()}`, 60_000, 1)).count).toBe(1);
    await store.close();
    // Over plain TCP there is nothing to bind to: refused before any password is sent.
    const plain = postgresStore({ url: `${server.url}?channel_binding=require&sslmode=disable`, timeoutMs: 5_000 });
    expect(['ERR_CONNECTION', 'ERR_AUTH']).toContain((await rejection(plain.ping())).code);
    await plain.close();
  });

  it('the default (prefer, as libpq) uses TLS where the server offers it', async () => {
    const store = postgresStore({ url: url('application_name=tls_prefer'), timeoutMs: 5_000 });
    await store.ping();
    expect(await overTls('tls_prefer')).toBe('1');
    await store.close();
  });

  it('verify-full checks the certificate and the host name against tls.ca; the option overrides the URL', async () => {
    const store = postgresStore({
      url: url('sslmode=disable&application_name=tls_full'),
      sslmode: 'verify-full',
      tls: { ca },
      timeoutMs: 5_000,
    });
    const key = `full:${randomUUID()}`;
    expect((await store.slidingWindow.increment(key, 60_000, 3)).count).toBe(3);
    expect(await overTls('tls_full')).toBe('1');
    await store.close();
    const ca_ = postgresStore({ url: url('sslmode=verify-ca'), tls: { ca }, timeoutMs: 5_000 });
    await ca_.ping();
    await ca_.close();
  });

  it('verify-full without the private CA rejects with ERR_CONNECTION, naming no secret', async () => {
    const store = postgresStore({ url: url('sslmode=verify-full'), timeoutMs: 5_000 });
    const error = await rejection(store.hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_CONNECTION');
    expect(error.message).toMatch(/certificate|UnknownIssuer/i);
    await store.close();
  });

  it('require with tls.ca checks the chain: another CA is refused', async () => {
    const otherDir = mkdtempSync(join(tmpdir(), 'ratestore-pg-other-'));
    try {
      const other = readFileSync((await makeCertificates(otherDir)).ca, 'utf8');
      const store = postgresStore({ url: url('sslmode=require'), tls: { ca: other }, timeoutMs: 5_000 });
      expect((await rejection(store.ping())).code).toBe('ERR_CONNECTION');
      await store.close();
    } finally {
      rmSync(otherDir, { recursive: true, force: true });
    }
  });

  it('verify-full refuses a certificate of the CA for another name; verify-ca and require with tls.ca accept it', async () => {
    // A second server, whose certificate (from the same CA) names elsewhere.invalid only.
    const openssl = (...args: string[]) =>
      new Promise<void>((resolve, reject) =>
        execFile('openssl', args, { cwd: certDir }, (error, _out, stderr) =>
          error ? reject(new Error(`openssl ${args[0]} failed: ${stderr}`)) : resolve(),
        ),
      );
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await openssl('req', ...ec, '-keyout', 'other.key', '-out', 'other.csr', '-subj', '/CN=elsewhere');
    writeFileSync(join(certDir, 'other.cnf'), 'subjectAltName=DNS:elsewhere.invalid\n');
    await openssl(
      'x509',
      '-req',
      '-in',
      'other.csr',
      '-CA',
      'ca.crt',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      'other.crt',
      '-days',
      '2',
      '-extfile',
      'other.cnf',
    );
    const other = await startPostgres({ tls: { cert: join(certDir, 'other.crt'), key: join(certDir, 'other.key') } });
    try {
      const full = postgresStore({ url: `${other.url}?sslmode=verify-full`, tls: { ca }, timeoutMs: 5_000 });
      const error = await rejection(full.ping());
      expect(error.code).toBe('ERR_CONNECTION');
      expect(error.message).toMatch(/not valid for/i);
      await full.close();
      for (const sslmode of ['verify-ca', 'require'] as const) {
        const store = postgresStore({ url: other.url, sslmode, tls: { ca }, timeoutMs: 5_000 });
        await store.ping();
        await store.close();
      }
    } finally {
      await other.stop();
    }
  }, 60_000);

  it('sslmode=disable is refused by a TLS-only server (ERR_AUTH), naming no secret', async () => {
    const store = postgresStore({ url: url('sslmode=disable'), timeoutMs: 5_000 });
    const error = await rejection(store.hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_AUTH');
    await store.close();
  });

  it('takes the URL parameters pg and Prisma users have, with their meaning; names an unknown one', async () => {
    const noVerify = postgresStore({ url: url('sslmode=no-verify&application_name=tls_noverify'), timeoutMs: 5_000 });
    await noVerify.ping();
    expect(await overTls('tls_noverify')).toBe('1');
    await noVerify.close();
    const prisma = postgresStore({
      url: url(
        'pgbouncer=true&connection_limit=1&pool_timeout=10&statement_cache_size=0&uselibpqcompat=true&sslmode=require',
      ),
      timeoutMs: 5_000,
    });
    expect((await prisma.hit(`prisma:${randomUUID()}`, 60_000, 1)).count).toBe(1);
    await prisma.close();
    // pg's ssl=true is a verified connection: without the private CA, refused.
    const verified = postgresStore({ url: url('ssl=true'), timeoutMs: 5_000 });
    expect((await rejection(verified.ping())).code).toBe('ERR_CONNECTION');
    await verified.close();
    const unknown = await rejection(postgresStore({ url: url('frobnicate=1') }).ping());
    expect(unknown.code).toBe('ERR_CONFIG');
    expect(unknown.message).toContain('"frobnicate"');
  });

  it('rejects settings it cannot use with ERR_CONFIG', async () => {
    const cases: PostgresStoreOptions[] = [
      { url: url('sslmode=allow') },
      { url: url('sslmode=disable'), tls: { ca } },
      { url: url('sslmode=require'), tls: { ca: 'not a certificate' } },
      { url: url('sslmode=require&sslrootcert=/etc/ssl/ca.pem') },
      { url: url('sslmode=require&sslrootcert=system') },
    ];
    for (const options of cases) {
      const error = await rejection(postgresStore(options).hit(KEY_MARKER, 60_000, 1));
      expect([JSON.stringify(options.url?.replace(tlsServer.url, '')), error.code]).toEqual([
        JSON.stringify(options.url?.replace(tlsServer.url, '')),
        'ERR_CONFIG',
      ]);
    }
  });
});
