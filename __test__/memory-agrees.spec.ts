// memoryStore against redisStore (a real redis-server) on the same clock: the
// window edges, a state read with another windowMs, a full store, and windows
// of 1 ms must come out alike.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { memoryStore, redisStore, type MemoryStore, type RedisStore } from '../index.js';
import { startRedis, type RedisServer } from './support/redis.js';

let server: RedisServer;
let redis: RedisStore;
let memory: MemoryStore;
let n = 0;
const key = () => `agrees-${process.pid}-${++n}`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits until the wall clock is `from` to `to` ms into a period of `period` ms. */
async function phase(from: number, to: number, period = 1000): Promise<void> {
  for (;;) {
    const at = Date.now() % period;
    if (at >= from && at < to) return;
    await sleep(at < from ? from - at : period - at + from);
  }
}

beforeAll(async () => {
  server = await startRedis();
  redis = redisStore({ url: server.url, prefix: 'agrees:', timeoutMs: 5_000 });
  memory = memoryStore();
});
afterAll(async () => {
  await memory?.close();
  await redis?.close();
  await server?.stop();
});

describe('memoryStore answers as Redis does', () => {
  it('aligns sliding windows on the wall clock, as Redis and Date.now() do', async () => {
    for (let attempt = 0; ; attempt++) {
      await phase(5, 60);
      const [m, r] = [key(), key()];
      const first = Date.now();
      for (let i = 0; i < 10; i++) {
        await Promise.all([memory.slidingWindow.increment(m, 1000), redis.slidingWindow.increment(r, 1000)]);
      }
      await sleep(first + 1250 - Date.now());
      const at = Date.now();
      const [mem, red] = await Promise.all([
        memory.slidingWindow.increment(m, 1000),
        redis.slidingWindow.increment(r, 1000),
      ]);
      const done = Date.now();
      // The model from Date.now(): 10 in the previous window, weighted by the time left in this one.
      const left = 1000 - (at % 1000);
      const model = (10 * left) / 1000 + 1;
      const sameWindows = Math.floor(first / 1000) + 1 === Math.floor(done / 1000) && done % 1000 < 400;
      if (!sameWindows && attempt < 3) continue; // the machine was too slow to stay in the windows
      expect(mem.count).toBe(red.count);
      expect(Math.abs(mem.count - model)).toBeLessThanOrEqual(1);
      expect(Math.abs(mem.resetMs - red.resetMs)).toBeLessThanOrEqual(20);
      expect(Math.abs(mem.resetMs - (1000 - (done % 1000)))).toBeLessThanOrEqual(20);
      return;
    }
  });

  it('starts a daily sliding window at midnight UTC', async () => {
    const day = 86_400_000;
    const before = Date.now();
    const { resetMs } = await memory.slidingWindow.increment(key(), day);
    const after = Date.now();
    expect(resetMs).toBeLessThanOrEqual(day - (before % day) + 5);
    expect(resetMs).toBeGreaterThanOrEqual(day - (after % day) - 5);
  });

  it('counts a sliding state read with another windowMs only where its start lines up', async () => {
    await phase(100, 300);
    const [m, r] = [key(), key()];
    await Promise.all([memory.slidingWindow.increment(m, 1000, 5), redis.slidingWindow.increment(r, 1000, 5)]);
    await sleep(500);
    const [mem, red] = await Promise.all([
      memory.slidingWindow.increment(m, 100, 0),
      redis.slidingWindow.increment(r, 100, 0),
    ]);
    expect(red.count).toBe(0);
    expect(mem.count).toBe(0);
    const consumed = await Promise.all([
      memory.slidingWindow.consume(m, { windowMs: 100, limit: 5, cost: 5 }),
      redis.slidingWindow.consume(r, { windowMs: 100, limit: 5, cost: 5 }),
    ]);
    expect(consumed.map((c) => c.allowed)).toEqual([true, true]);
  });

  it('counts a state whose start lines up with the other windowMs, as Redis does', async () => {
    // A 1 s window's start is a 500 ms window's start too.
    await phase(10, 200);
    const [m, r] = [key(), key()];
    await Promise.all([memory.slidingWindow.increment(m, 1000, 3), redis.slidingWindow.increment(r, 1000, 3)]);
    const [mem, red] = await Promise.all([
      memory.slidingWindow.increment(m, 500, 0),
      redis.slidingWindow.increment(r, 500, 0),
    ]);
    expect(mem.count).toBe(red.count);
    expect(mem.count).toBe(3);
  });

  it('keeps or drops a sliding state whole when a full store makes room', async () => {
    // 6 in one 1 s window, then 1 early in the next, where the last window still weighs over 5/6: a
    // state of at least 6. A run whose timers a loaded machine held up past those phases (the 6 in
    // another window, or the reads more than 150 ms into the next) is made again on a fresh store.
    for (let attempt = 1; ; attempt++) {
      const store = memoryStore({ maxKeys: 3 });
      try {
        const k = key();
        await phase(100, 700);
        const window = Math.floor(Date.now() / 1000);
        await store.slidingWindow.increment(k, 1000, 6);
        if (Math.floor(Date.now() / 1000) !== window && attempt < 5) continue;
        await sleep((window + 1) * 1000 + 10 - Date.now());
        await store.slidingWindow.increment(k, 1000, 1);
        const whole = (await store.slidingWindow.increment(k, 1000, 0)).count;
        if (Date.now() > (window + 1) * 1000 + 150 && attempt < 5) continue;
        expect(whole).toBeGreaterThanOrEqual(6);
        // New keys take room: the state goes, or stays, as one.
        await store.hit(key(), 60_000, 1);
        await store.hit(key(), 60_000, 1);
        const after = (await store.slidingWindow.increment(k, 1000, 0)).count;
        expect([0, whole]).toContain(after);
        return;
      } finally {
        await store.close();
      }
    }
  });

  it('keeps a 1 ms window open for the whole ms tick, as Redis does', async () => {
    const trials = 40;
    const both = { memory: 0, redis: 0 };
    for (let i = 0; i < trials; i++) {
      const [m, r] = [key(), key()];
      const options = { limit: 1, windowMs: 1 };
      const mem = await Promise.all([memory.consume(m, options), memory.consume(m, options)]);
      const red = await Promise.all([redis.consume(r, options), redis.consume(r, options)]);
      if (mem.every((c) => c.allowed)) both.memory++;
      if (red.every((c) => c.allowed)) both.redis++;
    }
    // Two calls µs apart straddle a ms tick now and then, on either store.
    expect(both.memory).toBeLessThanOrEqual(trials / 4);
    expect(both.redis).toBeLessThanOrEqual(trials / 4);
  });

  it('counts two hits in one ms tick in one 1 ms window', async () => {
    let together = 0;
    for (let i = 0; i < 40; i++) {
      const k = key();
      const [a, b] = await Promise.all([memory.hit(k, 1, 1), memory.hit(k, 1, 1)]);
      if (a.count === 1 && b.count === 2) together++;
    }
    expect(together).toBeGreaterThanOrEqual(30);
  });
});
