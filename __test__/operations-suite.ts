// The operations beyond hit, run on every ratestore store: the same answers
// from memoryStore, redisStore and a Redis Cluster.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { RatestoreStore, RedisStore, RedisStoreOptions } from '../index.js';
import { rejection as rejectionOf } from './support/redis.js';

const MARKER = '203.0.113.99-operations-marker';

const rejection = (pending: Promise<unknown>) => rejectionOf(pending, [MARKER]);

export function operationsSuite(name: string, make: () => RatestoreStore): void {
  describe(`${name}: operations beyond hit`, () => {
    const key = () => `ops:${randomUUID()}`;

    it('consume lets exactly limit through 2,000 parallel calls on one key, and a refusal changes nothing', async () => {
      const store = make();
      const k = key();
      const results = await Promise.all(
        Array.from({ length: 2_000 }, () => store.consume(k, { limit: 50, windowMs: 60_000 })),
      );
      expect(results.filter((r) => r.allowed)).toHaveLength(50);
      const counts = results.filter((r) => r.allowed).map((r) => r.count);
      expect(new Set(counts).size).toBe(50);
      for (const r of results.filter((r) => !r.allowed)) {
        expect(r).toMatchObject({ count: 50, remaining: 0 });
        expect(r.retryMs).toBeGreaterThan(0);
        expect(r.retryMs).toBe(r.resetMs);
      }
      expect((await store.hit(k, 60_000, 0)).count).toBe(50);
    });

    it('consume: cost 0 reads, a cost above the limit is refused, and hit shares its counter', async () => {
      const store = make();
      const k = key();
      expect(await store.consume(k, { limit: 3, windowMs: 60_000, cost: 0 })).toEqual({
        allowed: true,
        count: 0,
        remaining: 3,
        resetMs: 60_000,
        retryMs: 0,
        window: 0,
      });
      expect((await store.hit(k, 60_000, 0)).count).toBe(0);
      expect((await store.consume(k, { limit: 3, windowMs: 60_000, cost: 4 })).allowed).toBe(false);
      await store.hit(k, 60_000, 2);
      const r = await store.consume(k, { limit: 3, windowMs: 60_000 });
      expect(r).toMatchObject({ allowed: true, count: 3, remaining: 0, retryMs: 0 });
      expect(r.resetMs).toBeLessThanOrEqual(60_000);
    });

    it('a give-back naming its window returns to that window only', async () => {
      const store = make();
      const k = key();
      const windowMs = 400;
      const first = await store.consume(k, { limit: 10, windowMs, cost: 3 });
      expect(first.window).toBeGreaterThan(0);
      expect(Number.isSafeInteger(first.window)).toBe(true);
      expect((await store.consume(k, { limit: 10, windowMs, cost: 1 })).window).toBe(first.window);
      expect((await store.refund(k, 2, { window: first.window }))?.count).toBe(2);
      await new Promise((resolve) => setTimeout(resolve, windowMs + 20));
      const next = await store.consume(k, { limit: 10, windowMs, cost: 2 });
      expect(next.window).not.toBe(first.window);
      // Late, into the window another call opened: nothing changes.
      expect(await store.refund(k, 2, { window: first.window })).toBeNull();
      expect((await store.hit(k, windowMs, 0)).count).toBe(2);
      expect((await store.refund(k, 1, { window: next.window }))?.count).toBe(1);
      await expect(store.refund(k, 1, { window: -1 })).rejects.toThrow(RangeError);
      await expect(store.refund(k, 1, { window: 1.5 })).rejects.toThrow(RangeError);

      // The sliding window: to the take's window, or to the previous one a window on; else nothing.
      const s = key();
      const sliding = store.slidingWindow;
      // Start just after an edge, so that the take and the read below fall in one aligned window.
      await sleep((await sliding.increment(s, windowMs, 0)).resetMs + 5);
      const took = await sliding.consume(s, { limit: 10, windowMs, cost: 3 });
      expect(took.window).toBe((await sliding.increment(s, windowMs, 0)).window);
      expect((await sliding.decrement(s, windowMs, 1, { window: took.window })).window).toBe(took.window);
      await new Promise((resolve) => setTimeout(resolve, took.resetMs + 5));
      await sliding.increment(s, windowMs, 4);
      // A window on: from the previous count (2 left there), not from this window's 4.
      const back = await sliding.decrement(s, windowMs, 5, { window: took.window });
      expect(back.window).not.toBe(took.window);
      expect(back.count).toBe(4);
      await new Promise((resolve) => setTimeout(resolve, back.resetMs + 5));
      // Two windows on: nothing; this window's previous count (the 4) stays.
      const later = await sliding.decrement(s, windowMs, 5, { window: took.window });
      expect(later.count).toBeGreaterThan(0);
      expect((await sliding.decrement(s, windowMs, 5, { window: back.window })).count).toBe(0);
    });

    it('refund gives back within the open window, never below 0, and never opens one', async () => {
      const store = make();
      const k = key();
      expect(await store.refund(k, 1)).toBeNull();
      expect((await store.hit(k, 60_000, 0)).count).toBe(0);
      await store.consume(k, { limit: 10, windowMs: 60_000, cost: 3 });
      expect((await store.refund(k, 2))?.count).toBe(1);
      expect((await store.refund(k, 5))?.count).toBe(0);
      const short = key();
      await store.hit(short, 50, 2);
      await sleep(80);
      expect(await store.refund(short, 1)).toBeNull();
      // The refund that came after the window opened nothing: the next window starts clean.
      expect((await store.consume(short, { limit: 2, windowMs: 60_000, cost: 2 })).allowed).toBe(true);
    });

    it('sliding window: weighs the previous window by its share still inside, across an edge', async () => {
      const store = make();
      const k = key();
      // The previous window's share of 4 falls by one every windowMs / 4: 300 ms for the calls between
      // b and the last decrement, on a loaded machine too.
      const windowMs = 1_200;
      // Start just after an edge so the first counts stay in one window.
      const first = await store.slidingWindow.increment(k, windowMs, 0);
      await sleep(first.resetMs + 5);
      const a = await store.slidingWindow.increment(k, windowMs, 4);
      expect(a.count).toBe(4);
      await sleep(a.resetMs + windowMs / 4);
      // Now inside the next window, with about 3/4 of the previous one still inside.
      const b = await store.slidingWindow.increment(k, windowMs, 0);
      expect(b.count).toBeGreaterThanOrEqual(1);
      expect(b.count).toBeLessThanOrEqual(3);
      const c = await store.slidingWindow.consume(k, { limit: b.count + 1, windowMs, cost: 2 });
      expect(c.allowed).toBe(false);
      expect(c.retryMs).toBeGreaterThan(0);
      expect(c.retryMs).toBeLessThanOrEqual(windowMs);
      expect((await store.slidingWindow.consume(k, { limit: b.count + 1, windowMs, cost: 1 })).allowed).toBe(true);
      expect((await store.slidingWindow.decrement(k, windowMs)).count).toBe(b.count);
    });

    it('sliding window: exactly limit pass 500 parallel consumes', async () => {
      const store = make();
      const k = key();
      const results = await Promise.all(
        Array.from({ length: 500 }, () => store.slidingWindow.consume(k, { limit: 20, windowMs: 60_000 })),
      );
      expect(results.filter((r) => r.allowed)).toHaveLength(20);
    });

    it('token bucket: takes, refuses with the time until enough tokens, and refills', async () => {
      const store = make();
      const k = key();
      // An interval long enough that a loaded machine's late timer does not refill a second token.
      const bucket = { capacity: 3, refill: 1, intervalMs: 600 };
      const first = await store.tokenBucket(k, { ...bucket, cost: 3 });
      expect(first).toMatchObject({ allowed: true, remaining: 0, retryMs: 0 });
      const refused = await store.tokenBucket(k, bucket);
      expect(refused.allowed).toBe(false);
      expect(refused.retryMs).toBeGreaterThan(0);
      expect(refused.retryMs).toBeLessThanOrEqual(600);
      await sleep(refused.retryMs + 20);
      expect(await store.tokenBucket(k, bucket)).toMatchObject({ allowed: true, remaining: 0 });
      expect((await store.tokenBucket(k, { ...bucket, cost: 4 })).allowed).toBe(false);
      const parallel = key();
      const all = await Promise.all(
        Array.from({ length: 300 }, () => store.tokenBucket(parallel, { capacity: 10, refill: 1, intervalMs: 60_000 })),
      );
      expect(all.filter((r) => r.allowed)).toHaveLength(10);
    });

    it('keeps each algorithm under its own key: switching one never misreads another', async () => {
      const store = make();
      const k = key();
      await store.hit(k, 60_000, 7);
      expect((await store.slidingWindow.increment(k, 60_000, 0)).count).toBe(0);
      expect((await store.tokenBucket(k, { capacity: 5, refill: 1, intervalMs: 1_000, cost: 0 })).remaining).toBe(5);
      expect((await store.hit(k, 60_000, 0)).count).toBe(7);
    });

    it('reset removes every state of a key, under concurrent hits on other keys', async () => {
      const store = make();
      const [k, other] = [key(), key()];
      await store.hit(k, 60_000, 3);
      await store.slidingWindow.increment(k, 60_000, 3);
      await store.tokenBucket(k, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 5 });
      const busy = Promise.all(Array.from({ length: 200 }, () => store.hit(other, 60_000, 1)));
      await store.reset(k);
      await busy;
      expect((await store.hit(k, 60_000, 0)).count).toBe(0);
      expect((await store.slidingWindow.increment(k, 60_000, 0)).count).toBe(0);
      expect((await store.tokenBucket(k, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 0 })).remaining).toBe(5);
      expect((await store.hit(other, 60_000, 0)).count).toBe(200);
    });

    it('resetAll empties the store under concurrent hits, and it counts again at once', async () => {
      const store = make();
      const keys = Array.from({ length: 50 }, key);
      await Promise.all(keys.map((k) => store.hit(k, 60_000, 2)));
      const busy = key();
      const during = Promise.all(Array.from({ length: 200 }, () => store.hit(busy, 60_000, 1)));
      await store.resetAll();
      // Every concurrent hit settled with a count: each counted before or after the reset.
      for (const { count } of await during) {
        expect(count).toBeGreaterThanOrEqual(1);
        expect(count).toBeLessThanOrEqual(200);
      }
      for (const k of keys.slice(0, 5)) expect((await store.hit(k, 60_000, 0)).count).toBe(0);
      expect((await store.hit(keys[0], 60_000, 1)).count).toBe(1);
    });

    it('refuses bad arguments of every operation with a TypeError or RangeError, changing nothing', async () => {
      const store = make();
      await store.hit(MARKER, 60_000, 1);
      const s = store as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
      const sliding = store.slidingWindow as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
      const cases: [string, () => Promise<unknown>, typeof TypeError | typeof RangeError][] = [
        ['consume without options', () => s.consume(MARKER), TypeError],
        ['consume with a string limit', () => s.consume(MARKER, { limit: '5', windowMs: 1_000 }), TypeError],
        ['consume with a negative limit', () => s.consume(MARKER, { limit: -1, windowMs: 1_000 }), RangeError],
        [
          'consume with a fractional cost',
          () => s.consume(MARKER, { limit: 5, windowMs: 1_000, cost: 0.5 }),
          RangeError,
        ],
        ['consume with windowMs 0', () => s.consume(MARKER, { limit: 5, windowMs: 0 }), RangeError],
        ['consume with a number key', () => s.consume(5, { limit: 5, windowMs: 1_000 }), TypeError],
        ['refund with a negative amount', () => s.refund(MARKER, -1), RangeError],
        ['refund with no amount', () => s.refund(MARKER), TypeError],
        ['sliding increment with NaN', () => sliding.increment(MARKER, NaN), RangeError],
        ['sliding decrement with a string', () => sliding.decrement(MARKER, 1_000, '1'), TypeError],
        ['sliding consume with an array', () => sliding.consume(MARKER, []), TypeError],
        [
          'token bucket with capacity 0',
          () => s.tokenBucket(MARKER, { capacity: 0, refill: 1, intervalMs: 1 }),
          RangeError,
        ],
        ['token bucket with no refill', () => s.tokenBucket(MARKER, { capacity: 1, intervalMs: 1 }), TypeError],
        ['reset with a number', () => s.reset(1), TypeError],
      ];
      for (const [what, call, kind] of cases) {
        const error = await rejection(call());
        expect(error, what).toBeInstanceOf(kind);
        expect(error.message, what).toMatch(/^ratestore: /);
      }
      expect((await store.hit(MARKER, 60_000, 0)).count).toBe(1);
    });
  });
}

/**
 * With one connection open and idle, hits on a new key made a tick apart (`a` takes the connection,
 * `b1` and `b2` need new ones over REST) and one made once `a` answered: their counts, in call order.
 */
export async function tickApart(store: RedisStore): Promise<number[]> {
  const tick = () => new Promise((resolve) => setImmediate(resolve));
  await store.hit(`warm:${randomUUID()}`, 60_000, 1);
  const k = `order:${randomUUID()}`;
  const a = store.hit(k, 60_000, 1);
  await tick();
  const b1 = store.hit(k, 60_000, 1);
  await tick();
  const b2 = store.hit(k, 60_000, 1);
  await a;
  const c = store.hit(k, 60_000, 1);
  return (await Promise.all([a, b1, b2, c])).map((r) => r.count);
}

/**
 * What only a Redis store has, on every transport: ping() and connect() touch no key, and a
 * store's calls on one key take effect in the order they were made, resetAll() and a flushed
 * script cache (`flushScripts`: SCRIPT FLUSH on every server) included.
 */
export function redisOrderSuite(
  name: string,
  make: (options?: RedisStoreOptions) => RedisStore,
  flushScripts: () => Promise<unknown>,
): void {
  describe(`${name}: ping and the order of calls`, () => {
    const key = () => `order:${randomUUID()}`;

    it('ping() and connect() answer and touch nothing, not even a key named exactly the prefix', async () => {
      const store = make();
      // The empty key's state lives at the bare prefix.
      await store.hit('', 60_000, 5);
      await store.ping();
      await store.connect();
      await Promise.all([store.ping(), store.connect(), store.ping()]);
      expect((await store.hit('', 60_000, 0)).count).toBe(5);
      await store.reset('');
    });

    it('calls on one key made in one tick take effect in order, after SCRIPT FLUSH too', async () => {
      const store = make();
      await store.hit(key(), 60_000, 1);
      for (const flush of [false, true, true]) {
        if (flush) await flushScripts();
        const k = key();
        const [consumed, hit] = await Promise.all([
          store.consume(k, { limit: 10, windowMs: 60_000 }),
          store.hit(k, 60_000, 3),
        ]);
        expect([consumed.count, hit.count]).toEqual([1, 4]);
      }
    });

    it('a script first used on a connection never runs after the calls made behind it', async () => {
      const store = make();
      await flushScripts();
      // The window script is cached, the consume script not.
      await store.hit(key(), 60_000, 1);
      const k = key();
      const [consumed, hit] = await Promise.all([
        store.consume(k, { limit: 10, windowMs: 60_000 }),
        store.hit(k, 60_000, 3),
      ]);
      expect([consumed.count, hit.count]).toEqual([1, 4]);
    });

    it("after SCRIPT FLUSH, a script's first use waits for the older call's retry", async () => {
      const store = make();
      // The consume script is cached on this store's connections, the window script is not...
      await store.consume(key(), { limit: 10, windowMs: 60_000 });
      // ...and then the cache is flushed: the consume meets NOSCRIPT, the hit goes as EVAL.
      await flushScripts();
      const k = key();
      const [consumed, hit] = await Promise.all([
        store.consume(k, { limit: 10, windowMs: 60_000 }),
        store.hit(k, 60_000, 3),
      ]);
      expect([consumed.count, hit.count]).toEqual([1, 4]);
    });

    it('reset and resetAll take effect between the calls made before and after them', async () => {
      const store = make();
      for (const flush of [false, true]) {
        if (flush) await flushScripts();
        // Several keys: on a cluster, the order broke only for some slot placements.
        for (let n = 0; n < 12; n++) {
          const k = key();
          const [, , after] = await Promise.all([store.hit(k, 60_000, 2), store.reset(k), store.hit(k, 60_000, 1)]);
          expect(after.count).toBe(1);
          expect((await store.hit(k, 60_000, 0)).count).toBe(1);
        }
        const j = key();
        const [before, , later] = await Promise.all([
          store.hit(j, 60_000, 1),
          store.resetAll(),
          store.hit(j, 60_000, 1),
        ]);
        expect([before.count, later.count]).toEqual([1, 1]);
        expect((await store.hit(j, 60_000, 0)).count).toBe(1);
      }
      // Calls and resetAll()s made while one runs keep their order.
      const k = key();
      const answers = await Promise.all([
        store.resetAll(),
        store.hit(k, 60_000, 1),
        store.resetAll(),
        store.hit(k, 60_000, 2),
        store.hit(k, 60_000, 3),
      ]);
      expect(answers.slice(1).map((a) => a?.count)).toEqual([1, undefined, 2, 5]);
    });

    it('calls on one key made a tick apart take effect in order', async () => {
      for (let round = 0; round < 60; round++) {
        // Settings of its own: new connections (over REST, a new pool) each round.
        const store = make({ timeoutMs: 5_000 + round });
        expect(await tickApart(store)).toEqual([1, 2, 3, 4]);
        await store.close();
      }
    });
  });
}
