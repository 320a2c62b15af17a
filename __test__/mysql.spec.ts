import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mysqlStore, type MysqlStoreOptions } from '../index.js';
import { loneSurrogatesMadeTogether, rateLimitStoreContract } from './contract.js';
import { expressSuite } from './express-suite.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite } from './operations-suite.js';
import { universalSuite } from './universal-suite.js';
import { plainMariadb } from './support/mariadb.js';

let server: Awaited<ReturnType<typeof plainMariadb>>;
beforeAll(async () => {
  server = await plainMariadb();
}, 120_000);
afterAll(() => server?.stop());

// The shared suites' stores use tables of this file's own, so that their resetAll() empties only what
// they wrote.
const table = `suites_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
const make = (options: MysqlStoreOptions = {}) => mysqlStore({ url: server.url, table, timeoutMs: 5_000, ...options });

rateLimitStoreContract('mysqlStore', () => make());
limiterSuite('mysqlStore', () => make());
operationsSuite('mysqlStore', () => make());
// The adapters' suites count on fixed keys (the client's address) in each test: a table per store.
const isolated = () => make({ table: `adapter_${randomUUID().replace(/-/g, '').slice(0, 20)}` });
universalSuite('mysqlStore', isolated);
expressSuite('mysqlStore', isolated);

describe('mysqlStore: calls made together', () => {
  it('calls made in one turn: a key with a lone surrogate fails alone with a TypeError, the others count in the order they were made', async () => {
    await loneSurrogatesMadeTogether(make());
  });

  it("fixed-window hits on several keys made together go as one upsert, not a procedure call each: each answers its running count in call order, a key's window set by its first hit; a hit past the safe range fails alone", async () => {
    const store = make({ table: `upsert_${randomUUID().replace(/-/g, '').slice(0, 20)}`, connections: 1 });
    const run = randomUUID();
    const MAX = Number.MAX_SAFE_INTEGER;
    const full = `hits:${run}:full`;
    await store.hit(full, 60_000, MAX - 5);
    const procedureCalls = async () =>
      Number((await server.sql("SHOW GLOBAL STATUS LIKE 'Com_call_procedure'")).split('\t')[1]);
    const before = await procedureCalls();
    // One turn: 40 keys hit in turn, 5 rounds, key i's amounts 1, 2, 3, ...; its first hit's window 60 s, the later ones' 5 s.
    const keys = Array.from({ length: 40 }, (_, i) => `hits:${run}:${i}`);
    const calls: Promise<{ count: number; resetMs: number }>[] = [];
    for (let round = 0; round < 5; round++) {
      for (const key of keys) calls.push(store.hit(key, round === 0 ? 60_000 : 5_000, round + 1));
    }
    const answers = await Promise.all(calls);
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < keys.length; i++) {
        const { count, resetMs } = answers[round * keys.length + i];
        expect(count).toBe(((round + 1) * (round + 2)) / 2);
        expect(resetMs).toBeGreaterThan(55_000);
        expect(resetMs).toBeLessThanOrEqual(60_000);
      }
    }
    // The first hit went alone (one call); the other 199 as one statement, not a call per key.
    expect((await procedureCalls()) - before).toBeLessThan(5);
    // Hits that cross the safe range, made together with others: the batch goes again as calls, and only the hit past the range fails.
    const settled = await Promise.allSettled([
      store.hit(keys[0], 60_000, 1),
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(keys[1], 60_000, 1),
    ]);
    const value = (i: number) => (settled[i] as PromiseFulfilledResult<{ count: number }>).value.count;
    expect([value(0), value(1), value(2), value(4)]).toEqual([16, MAX - 3, MAX - 1, 16]);
    const range = (settled[3] as PromiseRejectedResult).reason;
    expect(range).toBeInstanceOf(RangeError);
    expect(range.code).toBe('ERR_COUNT_RANGE');
    expect((await store.hit(full, 60_000, 0)).count).toBe(MAX - 1);
    expect((await store.hit(keys[2], 60_000, 0)).count).toBe(15);
    await store.close();
  });
});

describe('mysqlStore: resetAll() and the calls around it', () => {
  // Differential seed 306916921: hit, resetAll(), hit on one key made together; the second hit went out
  // on another connection while resetAll()'s DELETE was still running, counted 2 in the window the
  // first opened, and was then deleted. A table of a few thousand rows makes the DELETE take a while, and
  // the key's row is the last one it reaches (a key past 255 bytes is stored as 0xFF and its SHA-256).
  it('a call made after resetAll() waits for it, on whatever connection it goes out', async () => {
    const store = make({ table: `order_${randomUUID().replace(/-/g, '').slice(0, 20)}`, connections: 4 });
    try {
      // Made at once: every connection is open (and idle) before the calls under test.
      const rows = 3_000;
      await Promise.all(Array.from({ length: rows }, (_, i) => store.hit(`filler:${i}`, 600_000, 1)));
      const key = `last:${'x'.repeat(300)}`;
      for (let round = 0; round < 3; round++) {
        const first = store.hit(key, 600_000, 1);
        const reset = store.resetAll();
        const second = store.hit(key, 600_000, 1);
        const [a, , b] = await Promise.all([first, reset, second]);
        expect(a.count, `round ${round}: the first hit`).toBe(round === 0 ? 1 : 2);
        expect(b.count, `round ${round}: the hit made after resetAll()`).toBe(1);
        expect(b.resetMs).toBe(600_000);
        // Nothing else survived the reset; the next round's table is as full again.
        expect((await store.hit('filler:0', 600_000, 0)).count).toBe(0);
        await Promise.all(Array.from({ length: rows }, (_, i) => store.hit(`filler:${i}`, 600_000, 1)));
      }
    } finally {
      await store.close();
    }
  }, 120_000);
});
