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
