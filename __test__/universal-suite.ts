// universalStore through a universal-rate-limit driver written from seed 004: every ratestore store
// runs these cases, with both algorithms.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { universalStore, type AdapterAlgorithm, type RatestoreStore } from '../index.js';
import { rateLimit, requestFrom, type Store } from './support/universal.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const ALGORITHMS: AdapterAlgorithm[] = ['fixed-window', 'sliding-window'];
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

export function universalSuite(name: string, create: () => RatestoreStore): void {
  for (const algorithm of ALGORITHMS) {
    describe(`universalStore(${algorithm}) over ${name}`, () => {
      const client = () => `198.51.100.${randomUUID()}`;
      const make = (windowMs = 60_000, store = create()): Store => universalStore({ windowMs, algorithm, store });

      it('lets exactly `limit` requests pass, then limits', async () => {
        const limiter = rateLimit({ windowMs: 60_000, limit: 5, store: make() });
        const request = requestFrom(client());
        const results = [];
        for (let i = 0; i < 8; i++) results.push(await limiter(request));
        expect(results.map((r) => r.limited)).toEqual([false, false, false, false, false, true, true, true]);
        expect(results.map((r) => r.totalHits)).toEqual(range(1, 8));
        expect(results.map((r) => r.remaining)).toEqual([4, 3, 2, 1, 0, 0, 0, 0]);
        // Another client is not limited by the first.
        expect((await limiter(requestFrom(client()))).limited).toBe(false);
      });

      it('counts concurrent increments on one key exactly', async () => {
        const store = make();
        const key = client();
        const results = await Promise.all(Array.from({ length: 50 }, () => store.increment(key)));
        expect(results.map((r) => r.totalHits).sort((a, b) => a - b)).toEqual(range(1, 50));
      });

      it('loses nothing under 2,000 parallel requests', async () => {
        const limiter = rateLimit({ windowMs: 3_600_000, limit: 150, store: make(3_600_000) });
        const clients = Array.from({ length: 10 }, client);
        const requests = Array.from({ length: 2_000 }, (_, i) => clients[i % clients.length]);
        const results = await Promise.all(requests.map((c) => limiter(requestFrom(c))));
        for (const c of clients) {
          const mine = results.filter((_, i) => requests[i] === c);
          expect(mine.filter((r) => !r.limited)).toHaveLength(150);
          expect(mine.map((r) => r.totalHits).sort((a, b) => a - b)).toEqual(range(1, 200));
        }
      });

      it('frees one key with resetKey, and every key with resetAll', async () => {
        const store = make();
        const limiter = rateLimit({ windowMs: 60_000, limit: 2, store });
        const [a, b, c] = [client(), client(), client()];
        for (const k of [a, b, c]) for (let i = 0; i < 3; i++) await limiter(requestFrom(k));
        expect((await limiter(requestFrom(a))).limited).toBe(true);
        await store.resetKey(a);
        const freed = await limiter(requestFrom(a));
        expect(freed).toMatchObject({ limited: false, totalHits: 1 });
        expect((await limiter(requestFrom(b))).limited).toBe(true);
        await store.resetAll();
        for (const k of [a, b, c])
          expect(await limiter(requestFrom(k))).toMatchObject({ limited: false, totalHits: 1 });
      });

      it('answers the end of the window as resetTime', async () => {
        const windowMs = 60_000;
        const store = make(windowMs);
        const key = client();
        const before = Date.now();
        const first = await store.increment(key);
        const after = Date.now();
        expect(first.resetTime).toBeInstanceOf(Date);
        const end = first.resetTime.getTime();
        if (algorithm === 'fixed-window') {
          // The window opens at the key's first hit.
          expect(end).toBeGreaterThanOrEqual(before + windowMs);
          expect(end).toBeLessThanOrEqual(after + windowMs + 2);
        } else {
          expect(end).toBeGreaterThan(before);
          expect(end).toBeLessThanOrEqual(after + windowMs + 2);
        }
        // Later hits in the window answer the same end, to the millisecond the result is rounded to and
        // within each call's round trip (resetTime is the time left, read where the count is kept, added to
        // this process's clock).
        await sleep(20);
        const sent = Date.now();
        const later = await store.increment(key);
        const trips = after - before + (Date.now() - sent);
        expect(Math.abs(later.resetTime.getTime() - end)).toBeLessThanOrEqual(3 + trips);
      });

      it('decrements a counted hit, never below 0, and never opens a window', async () => {
        const store = make();
        const key = client();
        await store.decrement(key);
        await store.decrement(key);
        expect((await store.increment(key)).totalHits).toBe(1);
        await store.increment(key);
        await store.increment(key);
        await expect(store.decrement(key)).resolves.toBeUndefined();
        expect((await store.increment(key)).totalHits).toBe(3);
        for (let i = 0; i < 5; i++) await store.decrement(key);
        expect((await store.increment(key)).totalHits).toBe(1);
      });

      it('resolves void from decrement, resetKey and resetAll, and shutdown leaves the store usable', async () => {
        const store = universalStore({ windowMs: 60_000, algorithm, store: create() });
        const key = client();
        await store.increment(key);
        await expect(store.decrement(key)).resolves.toBeUndefined();
        await expect(store.resetKey(key)).resolves.toBeUndefined();
        await expect(store.resetAll()).resolves.toBeUndefined();
        expect(store.shutdown()).toBeUndefined();
        expect((await store.increment(key)).totalHits).toBe(1);
      });

      it('rejects a key that is not a string with a TypeError, changing nothing', async () => {
        const store = make() as unknown as Record<string, (key: unknown) => Promise<unknown>>;
        for (const method of ['increment', 'decrement', 'resetKey']) {
          for (const bad of [42, undefined, null, { toString: () => 'k' }]) {
            const pending = store[method](bad);
            expect(pending).toBeInstanceOf(Promise);
            await expect(pending).rejects.toThrow(TypeError);
          }
        }
        await expect(store.increment('x'.repeat(2 * 1024 * 1024))).rejects.toThrow(RangeError);
      });

      if (algorithm === 'fixed-window') {
        it('starts afresh once the window has ended', async () => {
          const store = make(300);
          const key = client();
          for (let i = 0; i < 4; i++) await store.increment(key);
          await sleep(350);
          expect((await store.increment(key)).totalHits).toBe(1);
        });
      } else {
        it("weights the previous window's hits by the share of it still inside", async () => {
          const windowMs = 1_000;
          const store = make(windowMs);
          const key = client();
          // Start early in an aligned window, so that all ten hits land in it.
          const probe = await store.increment(client());
          const left = probe.resetTime.getTime() - Date.now();
          if (left < 700) await sleep(left + 10);
          for (let i = 0; i < 10; i++) await store.increment(key);
          const { resetTime } = await store.increment(client());
          // 300 ms into the next window: about 70% of the previous window is still inside.
          await sleep(resetTime.getTime() - Date.now() + 300);
          const before = Date.now();
          const next = await store.increment(key);
          const share = (next.resetTime.getTime() - before) / windowMs;
          expect(next.totalHits).toBeGreaterThanOrEqual(Math.floor(10 * share));
          expect(next.totalHits).toBeLessThanOrEqual(Math.floor(10 * share) + 2);
          expect(next.totalHits).toBeGreaterThan(1);
          expect(next.totalHits).toBeLessThan(11);
        });
      }
    });
  }
}
