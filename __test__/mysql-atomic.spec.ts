// Several limits as one step on mysqlStore (store[TAKES]): one transaction per step on one connection,
// its rows locked by table then key, written only when every take allows, else rolled back.
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, mysqlStore, type MysqlStoreOptions } from '../index.js';
import { atomicSuite } from './atomic-suite.js';
import { startMariadb, type MariadbServer } from './support/mariadb.js';

// The module index.js uses (an import would be a copy of its own, with another TAKES).
const { TAKES, OP } = createRequire(__filename)('../lib/ops.js') as { TAKES: symbol; OP: Record<string, number> };

let server: MariadbServer;
beforeAll(async () => {
  server = await startMariadb();
}, 120_000);
afterAll(() => server?.stop());

const table = `atomic_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Store = any;
const make = (options: MysqlStoreOptions = {}): Store =>
  mysqlStore({ url: server.url, table, timeoutMs: 5_000, ...options });

atomicSuite(
  'mysqlStore',
  () => make(),
  () => make(),
);
atomicSuite(
  'mysqlStore on one connection',
  () => make({ connections: 1 }),
  () => make({ connections: 1 }),
);

describe('mysqlStore steps beside other sessions', () => {
  it('a step on a row another session holds waits for it; other keys go on meanwhile', async () => {
    const store = make({ timeoutMs: 6_000 });
    const k = `held-${randomUUID()}`;
    const step = [
      { op: OP.consume, key: `${k}:a`, a: 60_000, b: 5, c: 1, d: 0 },
      { op: OP.consume, key: `${k}:b`, a: 60_000, b: 5, c: 1, d: 0 },
    ];
    expect((await store[TAKES](step)).allowed).toBe(true);
    const released = server.sql(
      `START TRANSACTION; SELECT 1 FROM ${table} WHERE k = '${k}:b' FOR UPDATE; DO SLEEP(1.5); COMMIT`,
    );
    await new Promise((r) => setTimeout(r, 300));
    const started = Date.now();
    const waiting = store[TAKES](step);
    expect((await store.hit(`other-${randomUUID()}`, 60_000, 1)).count).toBe(1);
    expect(Date.now() - started).toBeLessThan(1_000);
    const { allowed, answers } = await waiting;
    expect(allowed).toBe(true);
    expect(answers.map((a: { count: number }) => a.count)).toEqual([2, 2]);
    await released;
    await store.close();
  }, 30_000);

  it('many instances stepping over shared keys in opposite orders never deadlock, and count exactly', async () => {
    const stores = [make(), make(), make()];
    const k = `order-${randomUUID()}`;
    const limits = (names: string[]) => names.map((name) => ({ name, limit: 1_000, windowMs: 600_000 }));
    const limiters = stores.flatMap((store) => [
      createLimiter({ store, limits: limits(['a', 'b', 'c']) }),
      createLimiter({ store, limits: limits(['c', 'b', 'a']) }),
    ]);
    const checks = [];
    for (let i = 0; i < 20; i++) for (const limiter of limiters) checks.push(limiter.check(k));
    const answers = await Promise.all(checks);
    expect(answers.every((a) => a.allowed)).toBe(true);
    for (const name of ['a', 'b', 'c']) expect((await stores[0].hit(`${k}:${name}`, 600_000, 0)).count).toBe(120);
    await Promise.all(stores.map((s: Store) => s.close()));
  }, 60_000);

  it('a refused step leaves the lock wait and no transaction on the session: plain calls go on after it', async () => {
    const store = make({ connections: 1 });
    const k = `after-${randomUUID()}`;
    const step = [
      { op: OP.consume, key: `${k}:a`, a: 60_000, b: 5, c: 1, d: 0 },
      { op: OP.tokenBucket, key: `${k}:b`, a: 1, b: 1, c: 60_000, d: 2 },
    ];
    expect((await store[TAKES](step)).allowed).toBe(false);
    expect((await store.hit(`${k}:a`, 60_000, 1)).count).toBe(1);
    expect((await store.hit(`${k}:a`, 60_000, 0)).count).toBe(1);
    await store.close();
  });
});
