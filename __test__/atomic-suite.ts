// Several limits as one step (`store[TAKES]`), on any store that offers it: a check takes from every
// limit or from none, so a refused check never makes another one fail for room it only briefly held.
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore } from '../index.js';

// The module index.js uses (an import would be a copy of its own, with another TAKES).
const { OP, TAKES } = createRequire(__filename)('../lib/ops.js') as { OP: Record<string, number>; TAKES: symbol };

const DAY = 86_400_000;

type Take = { op: number; key: string; a: number; b: number; c: number; d: number };
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Store = any;

const windowTake = (key: string, limit: number, cost = 1, windowMs = 60_000): Take => ({
  op: OP.consume,
  key,
  a: windowMs,
  b: limit,
  c: cost,
  d: 0,
});
const slidingTake = (key: string, limit: number, cost = 1, windowMs = 60_000): Take => ({
  op: OP.slidingConsume,
  key,
  a: windowMs,
  b: limit,
  c: cost,
  d: 0,
});
const bucketTake = (key: string, capacity: number, cost = 1): Take => ({
  op: OP.tokenBucket,
  key,
  a: capacity,
  b: 1,
  c: 60_000,
  d: cost,
});

/** What a store holds for a window, a sliding window and a bucket key, read without changing it. */
async function rows(store: Store, w: string, s: string, b: string) {
  const window = await store.consume(w, { limit: 1_000, windowMs: 60_000, cost: 0 });
  const sliding = await store.slidingWindow.increment(s, 60_000, 0);
  const bucket = await store.tokenBucket(b, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 0 });
  return { window: window.count, sliding: sliding.count, bucket: bucket.remaining };
}

/** An answer without what depends on the clock or the window's id. */
const timeless = (answer: Record<string, unknown>) => {
  const { resetMs, retryMs, window, ...rest } = answer;
  void resetMs;
  void window;
  return { ...rest, waits: (retryMs as number) > 0 };
};

export function atomicSuite(name: string, make: () => Store, second?: () => Store) {
  describe(`several limits as one step on ${name}`, () => {
    it('offers store[TAKES]', async () => {
      const store = make();
      expect(typeof store[TAKES]).toBe('function');
      await store.close();
    });

    /** Burst 7 and daily 20 through `store`, the daily limit alone through `other`, 40 checks each at once. */
    async function burstAndDaily(store: Store, other: Store) {
      const both = createLimiter({
        store,
        limits: [
          { name: 'burst', limit: 7, windowMs: 600_000 },
          { name: 'daily', limit: 20, windowMs: DAY },
        ],
      });
      // The daily limit alone, on the same counter (`key + ':daily'`).
      const daily = createLimiter({ store: other, limit: 20, windowMs: DAY });
      const k = `user:${randomUUID()}`;
      const checks = [];
      for (let i = 0; i < 40; i++) {
        checks.push(both.check(k).then((a) => ['both', a.allowed] as const));
        checks.push(daily.check(`${k}:daily`).then((a) => ['daily', a.allowed] as const));
      }
      const answers = await Promise.all(checks);
      const allowed = (who: string) => answers.filter(([w, ok]) => w === who && ok).length;
      const burst = (await store.hit(`${k}:burst`, 600_000, 0)).count;
      return {
        both: allowed('both'),
        daily: allowed('daily'),
        counted: (await store.hit(`${k}:daily`, DAY, 0)).count,
        burst,
      };
    }

    it('burst 7 and daily 20, and a limiter of the daily limit alone at once: daily lets exactly 20 through', async () => {
      const store = make();
      const got = await burstAndDaily(store, store);
      expect(got).toEqual({ both: 7, daily: 13, counted: 20, burst: 7 });
      await store.close();
    });

    if (second !== undefined) {
      it('the same through two instances (two connections) racing in the store: exactly 20 through', async () => {
        const [store, other] = [make(), second()];
        for (let run = 0; run < 3; run++) {
          const got = await burstAndDaily(store, other);
          expect(got.both).toBeLessThanOrEqual(7);
          expect(got.both + got.daily).toBe(20);
          expect(got.counted).toBe(20);
          expect(got.burst).toBe(got.both);
        }
        await store.close();
        await other.close();
      });
    }

    it('a refused check takes nothing from the limits that would have allowed, the bucket included', async () => {
      const store = make();
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'burst', limit: 1, windowMs: 60_000 },
          { name: 'sliding', algorithm: 'sliding-window', limit: 10, windowMs: 60_000 },
          { name: 'bucket', algorithm: 'token-bucket', capacity: 5, refill: 1, intervalMs: 60_000 },
        ],
      });
      const k = randomUUID();
      expect((await limiter.check(k)).allowed).toBe(true);
      const refused = await limiter.check(k);
      expect(refused.allowed).toBe(false);
      expect(refused.limits.map((l) => [l.name, l.allowed, l.remaining])).toEqual([
        ['burst', false, 0],
        ['sliding', true, 9],
        ['bucket', true, 5],
      ]);
      expect(refused.headers['Retry-After']).toBe('60');
      expect((await store.slidingWindow.increment(`${k}:sliding`, 60_000, 0)).count).toBe(1);
      const bucket = await store.tokenBucket(`${k}:bucket`, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 0 });
      expect(bucket.remaining).toBe(4);
      await store.close();
    });

    it('a refused step leaves every row unchanged, and answers as memoryStore does', async () => {
      const store = make();
      const memory: Store = memoryStore();
      const k = randomUUID();
      const [w, s, b] = [`${k}:w`, `${k}:s`, `${k}:b`];
      const steps: Take[][] = [
        // Allowed: every row opened.
        [windowTake(w, 3), slidingTake(s, 4, 2), bucketTake(b, 5, 2)],
        // The window refuses (cost 3 over 2 left): nothing else is taken.
        [slidingTake(s, 4, 1), windowTake(w, 3, 3), bucketTake(b, 5, 1)],
        // The bucket refuses.
        [windowTake(w, 3, 1), slidingTake(s, 4, 1), bucketTake(b, 5, 4)],
        // The sliding window refuses, last.
        [bucketTake(b, 5, 1), windowTake(w, 3, 1), slidingTake(s, 4, 3)],
        // Allowed again.
        [windowTake(w, 3, 2), slidingTake(s, 4, 2), bucketTake(b, 5, 3)],
        // Everything refuses.
        [windowTake(w, 3, 1), slidingTake(s, 4, 1), bucketTake(b, 5, 1)],
      ];
      const expected = [
        { window: 1, sliding: 2, bucket: 3 },
        { window: 1, sliding: 2, bucket: 3 },
        { window: 1, sliding: 2, bucket: 3 },
        { window: 1, sliding: 2, bucket: 3 },
        { window: 3, sliding: 4, bucket: 0 },
        { window: 3, sliding: 4, bucket: 0 },
      ];
      for (const [i, step] of steps.entries()) {
        const got = await store[TAKES](step);
        const want = await memory[TAKES](step);
        expect(got.allowed).toBe(i === 0 || i === 4);
        expect(got.allowed).toBe(want.allowed);
        expect(got.answers.map(timeless)).toEqual(want.answers.map(timeless));
        expect(await rows(store, w, s, b)).toEqual(expected[i]);
      }
      await memory.close();
      await store.close();
    });

    it('two takes on one key in a step: the second sees the first', async () => {
      const store = make();
      const k = randomUUID();
      const step = [windowTake(k, 3, 2), windowTake(k, 3, 2)];
      const { allowed, answers } = await store[TAKES](step);
      expect(allowed).toBe(false);
      expect(answers.map((a: { allowed: boolean }) => a.allowed)).toEqual([true, false]);
      expect((await store.consume(k, { limit: 3, windowMs: 60_000, cost: 0 })).count).toBe(0);
      await store.close();
    });

    it('a key holding a row of another kind keeps it: each kind is its own counter', async () => {
      const store = make();
      const k = randomUUID();
      await store.tokenBucket(k, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 2 });
      const { allowed } = await store[TAKES]([windowTake(k, 3, 1), slidingTake(k, 3, 1)]);
      expect(allowed).toBe(true);
      expect(await rows(store, k, k, k)).toEqual({ window: 1, sliding: 1, bucket: 3 });
      await store.close();
    });

    it('bad input rejects and changes nothing', async () => {
      const store = make();
      const k = randomUUID();
      const [w, s, b] = [`${k}:w`, `${k}:s`, `${k}:b`];
      await store[TAKES]([windowTake(w, 5), slidingTake(s, 5), bucketTake(b, 5)]);
      const before = await rows(store, w, s, b);
      const good = [windowTake(w, 5), slidingTake(s, 5), bucketTake(b, 5)];
      const bad: [unknown, unknown][] = [
        [[...good, { ...windowTake(w, 5), b: Number.NaN }], RangeError],
        [[...good, { ...bucketTake(b, 5), a: 0 }], RangeError],
        [[...good, { ...slidingTake(s, 5), c: -1 }], RangeError],
        [[...good, { ...windowTake(w, 5), a: 1.5 }], RangeError],
        [[...good, { op: OP.hit, key: w, a: 60_000, b: 1, c: 0, d: 0 }], RangeError],
        [[...good, { op: OP.refund, key: w, a: 1, b: 0, c: 0, d: 0 }], RangeError],
        [[...good, { ...windowTake(w, 5), key: 7 }], TypeError],
        [[...good, null], TypeError],
        [[], RangeError],
        [Array.from({ length: 17 }, () => windowTake(w, 100)), RangeError],
        ['takes', TypeError],
      ];
      for (const [takes, type] of bad) {
        await expect(store[TAKES](takes)).rejects.toBeInstanceOf(type);
        expect(await rows(store, w, s, b)).toEqual(before);
      }
      await store.close();
    });

    it('rejects, changing nothing, when the store is closed', async () => {
      const store = make();
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'a', limit: 1, windowMs: 60_000 },
          { name: 'b', limit: 5, windowMs: 60_000 },
        ],
      });
      await store.close();
      await expect(limiter.check(randomUUID())).rejects.toMatchObject({ code: 'ERR_CLOSED' });
    });
  });
}
