// Several limits as one step on postgresStore (store[TAKES]): one transaction per step, its rows locked
// by table then key, rolled back whole when one take refuses; on a server of its own, directly and
// through PgBouncer in transaction mode.
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, postgresStore, type PostgresStoreOptions } from '../index.js';
import { atomicSuite } from './atomic-suite.js';
import { startPgbouncer, startPostgres, type Pgbouncer, type PostgresServer } from './support/postgres.js';

// The module index.js uses (an import would be a copy of its own, with another TAKES).
const { TAKES, OP } = createRequire(__filename)('../lib/ops.js') as { TAKES: symbol; OP: Record<string, number> };

let server: PostgresServer;
let bouncer: Pgbouncer;
beforeAll(async () => {
  server = await startPostgres();
  bouncer = await startPgbouncer(server, 2);
}, 120_000);
afterAll(async () => {
  await bouncer?.stop();
  await server?.stop();
});

const table = `atomic_${randomUUID().replace(/-/g, '')}`;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Store = any;
const make = (options: PostgresStoreOptions = {}): Store =>
  postgresStore({ url: server.url, table, timeoutMs: 5_000, ...options });
const pooled = () => postgresStore({ url: bouncer.url, table, timeoutMs: 5_000 });

atomicSuite(
  'postgresStore',
  () => make(),
  () => make(),
);
atomicSuite('postgresStore through PgBouncer (transaction mode)', pooled, pooled);

describe('postgresStore steps beside other sessions', () => {
  /** Holds `key`'s row of `t` locked from another session for `ms`; resolves once it is held. */
  async function holdRow(t: string, key: string, ms: number): Promise<{ released: Promise<string> }> {
    const tag = `hold_${randomUUID().replace(/-/g, '')}`;
    const done = server.sql(
      `SET application_name = '${tag}'; BEGIN; SELECT 1 FROM ${t} WHERE key = '${key}' FOR UPDATE; ` +
        `SELECT pg_sleep(${ms / 1000}); COMMIT`,
    );
    for (let i = 0; i < 200; i++) {
      const held = await server.sql(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${tag}' AND wait_event = 'PgSleep'`,
      );
      if (Number(held) > 0) return { released: done };
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error('the row lock was not taken');
  }

  it('a step on a row another session holds waits for it on the side; other keys go on meanwhile', async () => {
    const store = make({ timeoutMs: 4_000 });
    const k = `held-${randomUUID()}`;
    const step = [
      { op: OP.consume, key: `${k}:a`, a: 60_000, b: 5, c: 1, d: 0 },
      { op: OP.consume, key: `${k}:b`, a: 60_000, b: 5, c: 1, d: 0 },
    ];
    expect((await store[TAKES](step)).allowed).toBe(true);
    const { released } = await holdRow(table, `${k}:b`, 1_500);
    const started = Date.now();
    const waiting = store[TAKES](step);
    // Another key's call is answered while the step waits for the held row.
    expect((await store.hit(`other-${randomUUID()}`, 60_000, 1)).count).toBe(1);
    expect(Date.now() - started).toBeLessThan(1_400);
    const { allowed, answers } = await waiting;
    expect(allowed).toBe(true);
    expect(answers.map((a: { count: number }) => a.count)).toEqual([2, 2]);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
    await released;
    await store.close();
  }, 30_000);

  it('many instances stepping over shared keys in opposite orders never deadlock, and count exactly', async () => {
    const stores = [make(), make(), make()];
    const k = `order-${randomUUID()}`;
    const limits = (names: string[]) =>
      names.map(
        (name) => ({ name, limit: 1_000, windowMs: 600_000 }) as { name: string; limit: number; windowMs: number },
      );
    const limiters = stores.flatMap((store) => [
      createLimiter({ store, limits: limits(['a', 'b', 'c']) }),
      createLimiter({ store, limits: limits(['c', 'b', 'a']) }),
    ]);
    const checks = [];
    for (let i = 0; i < 30; i++) for (const limiter of limiters) checks.push(limiter.check(k));
    const answers = await Promise.all(checks);
    expect(answers.every((a) => a.allowed)).toBe(true);
    for (const name of ['a', 'b', 'c']) expect((await stores[0].hit(`${k}:${name}`, 600_000, 0)).count).toBe(180);
    await Promise.all(stores.map((s) => s.close()));
  }, 60_000);

  it('a count past the safe range rejects the step and changes nothing', async () => {
    const store = make();
    const k = `range-${randomUUID()}`;
    await store.hit(`${k}:a`, 60_000, 3);
    await store.slidingWindow.increment(`${k}:b`, 60_000, Number.MAX_SAFE_INTEGER - 1);
    const step = [
      { op: OP.consume, key: `${k}:a`, a: 60_000, b: 10, c: 1, d: 0 },
      { op: OP.slidingConsume, key: `${k}:b`, a: 60_000, b: Number.MAX_SAFE_INTEGER, c: 5, d: 0 },
    ];
    const outcome = await store[TAKES](step).then(
      (r: { allowed: boolean }) => r,
      (e: Error) => e,
    );
    // Refused (over its limit) or rejected: either way nothing of it counted.
    if (!(outcome instanceof Error)) expect(outcome.allowed).toBe(false);
    expect((await store.hit(`${k}:a`, 60_000, 0)).count).toBe(3);
    await store.close();
  });
});
