// The sliding window's rounding (up, as seed 004's) and the give-back rule: a give-back only ever
// returns what its request took, to the window it took it from. Every store is real (memoryStore, a
// redis-server of this suite's own); a wrapper around one delays its calls, as a slow network would.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createLimiter,
  expressStore,
  memoryStore,
  redisStore,
  universalStore,
  type CounterHit,
  type RateLimitStore,
  type RatestoreStore,
  type RedisStore,
} from '../index.js';
import { plainRedis } from './support/redis.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let server: Awaited<ReturnType<typeof plainRedis>>;
const stores: RedisStore[] = [];
beforeAll(async () => {
  server = await plainRedis();
});
afterAll(async () => {
  await Promise.all(stores.splice(0).map((store) => store.close()));
  await server?.stop();
});

const STORES: [string, () => RatestoreStore][] = [
  ['memoryStore', () => memoryStore()],
  [
    'redisStore',
    () => {
      const store = redisStore({ url: server.url, prefix: `giveback:${randomUUID()}:`, timeoutMs: 5_000 });
      stores.push(store);
      return store;
    },
  ],
];

/** Waits until the key's aligned sliding window of `windowMs` has `left` ms or fewer left, and more than `least`. */
async function untilLeft(store: RatestoreStore, windowMs: number, left: number, least = 0): Promise<void> {
  for (;;) {
    const { resetMs } = await store.slidingWindow.increment(`probe:${randomUUID()}`, windowMs, 0);
    if (resetMs <= left && resetMs > least) return;
    await sleep(Math.max(0, resetMs - left));
  }
}

/** Runs `attempt` until it answers true (the timing it needs held), at most `tries` times. */
async function withTiming(tries: number, attempt: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < tries; i++) if (await attempt()) return;
  throw new Error('the timing this case needs never held (a loaded machine?)');
}

describe.each(STORES)('the sliding window rounds up, on %s', (_, create) => {
  it('limit 1: a request 10 ms before an edge and one 10 ms after: the second is refused', async () => {
    const store = create();
    const windowMs = 1_000;
    const limiter = createLimiter({ store, algorithm: 'sliding-window', limit: 1, windowMs });
    await withTiming(5, async () => {
      const key = randomUUID();
      await untilLeft(store, windowMs, 10, 3);
      const before = await limiter.check(key);
      await sleep(20);
      const after = await limiter.check(key);
      // The first in the window's last 10 ms, the second in the next window's first 50.
      if (!(before.resetMs <= 12 && after.resetMs >= windowMs - 50 && after.resetMs < windowMs)) return false;
      expect(before.allowed).toBe(true);
      expect(after.allowed).toBe(false);
      expect(after.remaining).toBe(0);
      return true;
    });
  });

  it('limit 1: two requests that pass are at least windowMs apart', async () => {
    const store = create();
    const windowMs = 200;
    const limiter = createLimiter({ store, algorithm: 'sliding-window', limit: 1, windowMs });
    const key = randomUUID();
    const passed: number[] = [];
    const until = performance.now() + 3 * windowMs;
    while (performance.now() < until) {
      const sent = performance.now();
      if ((await limiter.check(key)).allowed) passed.push(sent);
      await sleep(5);
    }
    expect(passed.length).toBeGreaterThanOrEqual(1);
    // Each pass is timed from before its call; the store's clock may read up to a ms apart.
    for (let i = 1; i < passed.length; i++) expect(passed[i] - passed[i - 1]).toBeGreaterThan(windowMs - 2);
  });

  it('limit 10, 10 in the previous window, 25% into the window: exactly 2 more pass', async () => {
    const store = create();
    const windowMs = 2_000;
    const limiter = createLimiter({ store, algorithm: 'sliding-window', limit: 10, windowMs });
    await withTiming(5, async () => {
      const key = randomUUID();
      await untilLeft(store, windowMs, windowMs - 100, windowMs - 400);
      let last;
      for (let i = 0; i < 10; i++) expect((last = await limiter.check(key)).allowed).toBe(true);
      // 25% into the next window: 10 * 0.75 = 7.5 weighs 8.
      await sleep(last!.resetMs + 5);
      await untilLeft(store, windowMs, 1_500, 1_300);
      const answers = [];
      for (let i = 0; i < 4; i++) answers.push(await limiter.check(key));
      if (!(answers[3].resetMs > 1_250)) return false;
      expect(answers.map((a) => a.allowed)).toEqual([true, true, false, false]);
      return true;
    });
  });

  it("universalStore reports totalHits as seed 004's MemoryStore: ceil(previous * weight) + current", async () => {
    const store = create();
    const windowMs = 1_000;
    const universal = universalStore({ windowMs, algorithm: 'sliding-window', store });
    await withTiming(5, async () => {
      const key = randomUUID();
      await untilLeft(store, windowMs, 900, 500);
      const first = await universal.increment(key);
      expect(first.totalHits).toBe(1);
      // 10% into the next window: 1 * 0.9 weighs 1.
      await sleep(Math.max(0, first.resetTime.getTime() - Date.now() + 5));
      await untilLeft(store, windowMs, 900, 700);
      const hit = await universal.increment(key);
      if (!(hit.resetTime.getTime() - Date.now() > 650)) return false;
      expect(hit.totalHits).toBe(2);
      return true;
    });
  });
});

/**
 * A third-party store: only the contract's hit, over a real store's counters. A hit with a negative
 * amount (a give-back) reaches the counters `refundDelayMs` late; every hit's answer is recorded.
 */
function hitOnly(inner: RatestoreStore, refundDelayMs: number) {
  const answers: (CounterHit & { amount: number; at: number })[] = [];
  const store: RateLimitStore = {
    shared: inner.shared,
    async hit(key: string, windowMs: number, amount: number): Promise<CounterHit> {
      if (amount < 0) await sleep(refundDelayMs);
      const answer = await inner.hit(key, windowMs, amount);
      answers.push({ ...answer, amount, at: performance.now() });
      return answer;
    },
  };
  return { store, answers };
}

/** The same store with its give-backs (refund, sliding decrement) reaching it `delayMs` late. */
function lateGiveBacks(inner: RatestoreStore, delayMs: number): RatestoreStore {
  const sliding = inner.slidingWindow;
  const store = {
    shared: inner.shared,
    hit: inner.hit.bind(inner),
    consume: inner.consume.bind(inner),
    tokenBucket: inner.tokenBucket.bind(inner),
    reset: inner.reset.bind(inner),
    resetAll: inner.resetAll.bind(inner),
    async refund(...args: Parameters<RatestoreStore['refund']>) {
      await sleep(delayMs);
      return inner.refund(...args);
    },
    slidingWindow: {
      increment: sliding.increment.bind(sliding),
      consume: sliding.consume.bind(sliding),
      async decrement(...args: Parameters<RatestoreStore['slidingWindow']['decrement']>) {
        await sleep(delayMs);
        return sliding.decrement(...args);
      },
    },
  };
  return store as unknown as RatestoreStore;
}

describe.each(STORES)('a late give-back never lifts a limit, on %s', (_, create) => {
  it('a hit-only store: the refused hit of two at a window opening stays counted; the next window starts at 0', async () => {
    const windowMs = 100;
    const { store, answers } = hitOnly(create(), 120);
    const limiter = createLimiter({ store, limit: 1, windowMs });
    const key = randomUUID();
    const both = await Promise.all([limiter.check(key), limiter.check(key)]);
    expect(both.map((a) => a.allowed).sort()).toEqual([false, true]);
    await sleep(windowMs + 50);
    const next = [await limiter.check(key), await limiter.check(key)];
    expect(next.map((a) => a.allowed)).toEqual([true, false]);
    expect(answers.filter((a) => a.amount < 0)).toEqual([]);
  });

  it('a hit-only store: a give-back with a round trip above windowMs never lands in the next window', async () => {
    const windowMs = 100;
    const { store } = hitOnly(create(), 150);
    const limiter = createLimiter({ store, limit: 1, windowMs });
    const key = randomUUID();
    expect((await limiter.check(key)).allowed).toBe(true);
    const refused = limiter.check(key);
    await sleep(windowMs + 10);
    // Another request opens the next window before the give-back could land in it.
    expect((await limiter.check(key)).allowed).toBe(true);
    expect((await refused).allowed).toBe(false);
    expect((await limiter.check(key)).allowed).toBe(false);
  });

  it('several limits: a refund landing after the edge takes nothing from the window another request opened', async () => {
    // 400 ms: the window the plain limiter opens is read 50 ms after it opened, and must still be open
    // then on a loaded machine.
    const windowMs = 400;
    const inner = create();
    const store = lateGiveBacks(inner, windowMs + 60);
    const key = randomUUID();
    // Two limiters on one key's "w" counter; the first also has a bucket that refuses its second check.
    const bucketed = createLimiter({
      store,
      limits: [
        { name: 'w', limit: 2, windowMs },
        { name: 'b', algorithm: 'token-bucket', capacity: 1, refill: 1, intervalMs: 60_000 },
      ],
    });
    const plain = createLimiter({
      store,
      limits: [
        { name: 'w', limit: 2, windowMs },
        { name: 'z', limit: 99, windowMs },
      ],
    });
    expect((await bucketed.check(key)).allowed).toBe(true);
    const refused = bucketed.check(key);
    await sleep(windowMs + 10);
    const next = [await plain.check(key), await plain.check(key)];
    await refused;
    // The refund (for the window before) has landed; the window the plain limiter opened still holds 2.
    expect((await inner.consume(`${key}:w`, { limit: 2, windowMs, cost: 0 })).count).toBe(2);
    next.push(await plain.check(key));
    expect(next.map((a) => a.allowed)).toEqual([true, true, false]);
  });

  it('several limits: a sliding decrement landing windows later takes nothing from the current window', async () => {
    const windowMs = 200;
    const inner = create();
    const store = lateGiveBacks(inner, 2 * windowMs + 60);
    const key = randomUUID();
    const sliding = { name: 'w', algorithm: 'sliding-window' as const, limit: 2, windowMs };
    const bucketed = createLimiter({
      store,
      limits: [sliding, { name: 'b', algorithm: 'token-bucket', capacity: 1, refill: 1, intervalMs: 60_000 }],
    });
    const plain = createLimiter({ store, limits: [sliding, { name: 'z', limit: 99, windowMs }] });
    await untilLeft(inner, windowMs, windowMs - 10, windowMs - 60);
    expect((await bucketed.check(key)).allowed).toBe(true);
    const refused = bucketed.check(key);
    // Two windows on, where the previous window (the one after the take's) holds nothing.
    await sleep(60);
    await untilLeft(inner, windowMs, windowMs - 5, windowMs - 50);
    await sleep(windowMs);
    const next = [await plain.check(key), await plain.check(key)];
    await refused;
    next.push(await plain.check(key));
    expect(next.map((a) => a.allowed)).toEqual([true, true, false]);
  });

  it('expressStore: a decrement after an edge takes nothing from the window another request opened', async () => {
    const windowMs = 200;
    for (const algorithm of ['fixed-window', 'sliding-window'] as const) {
      const inner = create();
      const express = expressStore({ store: inner, algorithm, prefix: `${algorithm}:` });
      express.init({ windowMs });
      const key = randomUUID();
      if (algorithm === 'sliding-window') await untilLeft(inner, windowMs, windowMs - 10, windowMs - 60);
      await express.increment(key);
      // The request counted in the window before finishes (and is skipped) after the edge, once
      // another request counted in the new window.
      await sleep(2 * windowMs + 10);
      expect((await express.increment(key)).totalHits).toBe(1);
      await express.decrement(key);
      expect((await express.get(key))?.totalHits).toBe(1);
      // A decrement of the new window's own request is given back to it.
      await express.decrement(key);
      expect((await express.get(key))?.totalHits ?? 0).toBe(0);
    }
  });
});

describe('the adapters remember the windows of the last 10,000 keys', () => {
  it('gives a key it no longer remembers nothing back: the request stays counted', async () => {
    for (const algorithm of ['fixed-window', 'sliding-window'] as const) {
      const inner = memoryStore({ maxKeys: 100_000 });
      const universal = universalStore({ windowMs: 60_000, algorithm, store: inner });
      await universal.increment('first');
      for (let i = 0; i < 10_000; i++) await universal.increment(`other:${i}`);
      await universal.decrement('first');
      expect((await universal.increment('first')).totalHits).toBe(2);
      // A key it remembers is given back to.
      await universal.decrement('other:9999');
      expect((await universal.increment('other:9999')).totalHits).toBe(1);
    }
  });
});

describe('over a hit-only store the limiter never lets more than limit through in any window', () => {
  it('holds under random delays on every call, with parallel checks crossing edges', async () => {
    const windowMs = 100;
    const limit = 1;
    /** One run of 80 checks over about 360 ms: the windows it allowed a hit in, and the most in one. */
    async function run() {
      const inner = memoryStore();
      // Every positive hit as the counters answered it: its count and its window's end (±1 ms).
      const hits: { count: number; end: number }[] = [];
      const store: RateLimitStore = {
        shared: false,
        async hit(key, ms, amount) {
          await sleep(Math.random() * (amount < 0 ? 150 : 20));
          const answer = await inner.hit(key, ms, amount);
          if (amount > 0) hits.push({ count: answer.count, end: performance.now() + answer.resetMs });
          await sleep(Math.random() * 20);
          return answer;
        },
      };
      const limiter = createLimiter({ store, limit, windowMs });
      const key = randomUUID();
      const answers = await Promise.all(
        Array.from({ length: 80 }, async (_, i) => {
          await sleep(Math.floor(i / 2) * 9);
          return limiter.check(key);
        }),
      );
      // The limiter allows a check exactly when its hit counted within the limit.
      const within = hits.filter((h) => h.count <= limit);
      expect(answers.filter((a) => a.allowed).length).toBe(within.length);
      // Windows end at least windowMs apart: ends closer than windowMs / 2 are one window's.
      const ends = within.map((h) => h.end).sort((a, b) => a - b);
      let perWindow = 0;
      let most = 0;
      ends.forEach((end, i) => {
        perWindow = i > 0 && end - ends[i - 1] < windowMs / 2 ? perWindow + 1 : 1;
        most = Math.max(most, perWindow);
      });
      await inner.close();
      return { windows: ends.length, most };
    }
    // The rule holds in every run; a run counts once its checks crossed several edges. A stalled event
    // loop (a loaded machine) fires the checks' timers together and squeezes a run into fewer windows:
    // such a run is checked too, and another is made.
    let windows = 0;
    for (let tries = 0; tries < 5 && windows <= 3; tries++) {
      const result = await run();
      expect(result.most).toBeLessThanOrEqual(limit);
      windows = result.windows;
    }
    expect(windows).toBeGreaterThan(3);
  });
});
