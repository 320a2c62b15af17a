// createLimiter's block cache, over a real redis-server: a refusal is repeated in-process, with no
// store call, only while the store would refuse the same check, and is forgotten when this process
// resets or gives back what it proved.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, redisStore, type LimitResult, type RedisStore } from '../index.js';
import { scriptsRun, startRedis, type RedisServer } from './support/redis.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let server: RedisServer;
let store: RedisStore;

beforeAll(async () => {
  server = await startRedis();
  store = redisStore({ url: server.url, prefix: 'cache:' });
});

afterAll(async () => {
  await store?.close();
  await server?.stop();
});

const scripts = () => scriptsRun(server);

const key = () => `ip:${randomUUID()}`;

describe('the block cache', () => {
  it('is on for a shared store: after the first refusal, checks are refused with no store call', async () => {
    const limiter = createLimiter({ store, limit: 2, windowMs: 60_000 });
    const k = key();
    const before = await scripts();
    const answers: LimitResult<never>[] = [];
    for (let i = 0; i < 10; i++) answers.push(await limiter.check(k));
    expect(await scripts()).toBe(before + 3);
    expect(answers.map((a) => a.allowed)).toEqual([true, true, ...Array(8).fill(false)]);
    expect(answers.map((a) => a.cached)).toEqual([undefined, undefined, undefined, ...Array(7).fill(true)]);
    // The same answer as the store's refusal: headers, limit and remaining.
    const [fromStore, fromCache] = [answers[2], answers[3]];
    expect(fromCache.headers).toEqual(fromStore.headers);
    expect(fromCache.headers['Retry-After']).toBe('60');
    expect(fromCache).toMatchObject({ allowed: false, limit: 2, remaining: 0, retryAfter: 60 });
    expect(Math.abs(fromCache.resetAt - fromStore.resetAt)).toBeLessThan(50);
    expect(fromCache.limits).toEqual([
      expect.objectContaining({ name: '2-in-1min', allowed: false, remaining: 0, retryAfter: 60 }),
    ]);
    expect(limiter.stats()).toMatchObject({ checks: 10, cacheRefusals: 7, cacheEntries: 1 });
    expect(await server.cli('GET', `cache:${k}`)).toBe('2');
  });

  it('is off for memoryStore, and with blockCache: false', async () => {
    for (const limiter of [
      createLimiter({ store: memoryStore(), limit: 1, windowMs: 60_000 }),
      createLimiter({ store, limit: 1, windowMs: 60_000, blockCache: false }),
    ]) {
      const k = key();
      const answers = [];
      for (let i = 0; i < 4; i++) answers.push(await limiter.check(k));
      expect(answers.map((a) => a.cached)).toEqual([undefined, undefined, undefined, undefined]);
      expect(limiter.stats()).toMatchObject({ cacheRefusals: 0, cacheEntries: 0 });
    }
    const before = await scripts();
    const limiter = createLimiter({ store, limit: 1, windowMs: 60_000, blockCache: false });
    const k = key();
    for (let i = 0; i < 5; i++) await limiter.check(k);
    expect(await scripts()).toBe(before + 5);
  });

  it('counts Retry-After and the reset down, and ends at the time the refusal named', async () => {
    const limiter = createLimiter({ store, limit: 1, windowMs: 2_400 });
    const k = key();
    await limiter.check(k);
    const first = await limiter.check(k);
    expect(first).toMatchObject({ allowed: false, retryAfter: 3 });
    expect((await limiter.check(k)).cached).toBe(true);
    await sleep(1_000);
    const later = await limiter.check(k);
    expect(later).toMatchObject({ allowed: false, cached: true, retryAfter: 2 });
    expect(later.headers['Retry-After']).toBe('2');
    expect(later.headers['RateLimit-Reset']).toBe('2');
    expect(later.resetMs).toBeLessThan(first.resetMs - 900);
    await sleep(1_500);
    const next = await limiter.check(k);
    expect(next).toMatchObject({ allowed: true });
    expect(next.cached).toBeUndefined();
  });

  for (const [name, limit, read] of [
    [
      'a fixed window',
      { limit: 3, windowMs: 150 },
      async (k: string, cost: number) =>
        (await store.consume(k, { limit: 3, windowMs: 150, cost: 0 })).remaining < cost,
    ],
    [
      'a sliding window',
      { algorithm: 'sliding-window', limit: 3, windowMs: 150 },
      async (k: string, cost: number) =>
        (await store.slidingWindow.consume(k, { limit: 3, windowMs: 150, cost: 0 })).remaining < cost,
    ],
    [
      'a token bucket',
      { algorithm: 'token-bucket', capacity: 3, refill: 1, intervalMs: 60 },
      async (k: string, cost: number) =>
        (await store.tokenBucket(k, { capacity: 3, refill: 1, intervalMs: 60, cost: 0 })).remaining < cost,
    ],
  ] as const) {
    it(`refuses from the cache only what the store refuses at that moment: ${name}, across its edges`, async () => {
      const limiter = createLimiter({ store, ...limit } as Parameters<typeof createLimiter>[0]);
      const k = key();
      let cached = 0;
      let allowed = 0;
      const deadline = Date.now() + 1_000;
      for (let i = 0; Date.now() < deadline; i++) {
        const cost = (i % 3) + 1;
        // The store's state just before the check, read without changing it. Nothing else writes the
        // key, and time only moves a state towards allowing, so a refusal the store would not have
        // made then, it would not make at the check either.
        const storeRefuses = await read(k, cost);
        const answer = await limiter.check(k, cost);
        if (answer.cached) {
          cached++;
          expect(storeRefuses).toBe(true);
        } else if (answer.allowed) {
          allowed++;
        }
        await sleep(i % 4);
      }
      expect(cached).toBeGreaterThan(20);
      expect(allowed).toBeGreaterThan(6);
    });
  }

  it('caches a fixed window only for costs above what the refusal left', async () => {
    const limiter = createLimiter({ store, limit: 10, windowMs: 60_000 });
    const k = key();
    expect((await limiter.check(k, 8)).remaining).toBe(2);
    expect(await limiter.check(k, 5)).toMatchObject({ allowed: false, remaining: 2 });
    // Cost 3 is provably refused (2 left, counts only grow); 2 and 1 are not.
    expect(await limiter.check(k, 3)).toMatchObject({ allowed: false, cached: true });
    const before = await scripts();
    expect(await limiter.check(k, 1)).toMatchObject({ allowed: true, remaining: 1 });
    expect(await scripts()).toBe(before + 1);
    expect((await limiter.check(k, 2)).cached).toBeUndefined();
    expect((await limiter.check(k, 2)).cached).toBe(true);
    expect(await limiter.check(k, 1)).toMatchObject({ allowed: true, remaining: 0 });
    expect(await limiter.check(k, 1)).toMatchObject({ allowed: false });
    expect(await limiter.check(k, 1)).toMatchObject({ allowed: false, cached: true });
  });

  it('caches a sliding window and a bucket only for the refused cost or more', async () => {
    for (const limit of [
      { algorithm: 'sliding-window', limit: 5, windowMs: 60_000 },
      { algorithm: 'token-bucket', capacity: 5, refill: 1, intervalMs: 60_000 },
    ] as const) {
      const limiter = createLimiter({ store, ...limit } as Parameters<typeof createLimiter>[0]);
      const k = key();
      expect((await limiter.check(k, 3)).allowed).toBe(true);
      expect(await limiter.check(k, 5)).toMatchObject({ allowed: false });
      expect(await limiter.check(k, 5)).toMatchObject({ allowed: false, cached: true });
      expect((await limiter.check(k, 4)).cached).toBeUndefined();
      expect(await limiter.check(k, 1)).toMatchObject({ allowed: true, remaining: 1 });
      expect(await limiter.check(k, 2)).toMatchObject({ allowed: false });
      expect(await limiter.check(k, 2)).toMatchObject({ allowed: false, cached: true });
      expect(await limiter.check(k, 1)).toMatchObject({ allowed: true, remaining: 0 });
    }
  });

  it('with several limits: the one that refused is cached, the others answered as the refusal left them', async () => {
    const limiter = createLimiter({
      store,
      headers: 'draft-8',
      limits: [
        { name: 'burst', limit: 2, windowMs: 60_000 },
        { name: 'daily', limit: 100, windowMs: 86_400_000 },
      ],
    });
    const k = key();
    await limiter.check(k);
    await limiter.check(k);
    const refused = await limiter.check(k);
    const before = await scripts();
    const cached = await limiter.check(k);
    expect(await scripts()).toBe(before);
    expect(cached.cached).toBe(true);
    expect(cached.headers).toEqual(refused.headers);
    expect(cached.limits.map((l) => [l.name, l.allowed, l.remaining])).toEqual([
      ['burst', false, 0],
      ['daily', true, 98],
    ]);
    expect(await server.cli('GET', `cache:${k}:daily`)).toBe('2');
  });

  it('answers from the cache only while every limit that refused is still proven there', async () => {
    // A sliding limit of 0 refuses every check, but its refusal names a retry time too short to keep:
    // a cached answer would report it from the fixed window's entry as it last saw it, allowed.
    const limiter = createLimiter({
      store,
      limits: [
        { name: 'f', limit: 1, windowMs: 60_000 },
        { name: 's', algorithm: 'sliding-window', limit: 0, windowMs: 50 },
      ],
    });
    const k = key();
    for (let i = 0; i < 4; i++) {
      const answer = await limiter.check(k, { cost: 2 });
      expect(answer.cached).toBeUndefined();
      expect(answer.limits.map((l) => [l.name, l.allowed])).toEqual([
        ['f', false],
        ['s', false],
      ]);
      await sleep(60);
    }
  });

  it('keeps tiers apart: a refusal under one tier refuses nothing under another on the same key', async () => {
    const limiter = createLimiter({
      store,
      tiers: { anon: { limit: 1, windowMs: 60_000 }, pro: { limit: 5, windowMs: 60_000 } },
    });
    const k = key();
    await limiter.check(k, { tier: 'anon' });
    await limiter.check(k, { tier: 'anon' });
    expect((await limiter.check(k, { tier: 'anon' })).cached).toBe(true);
    const pro = await limiter.check(k, { tier: 'pro' });
    expect(pro).toMatchObject({ allowed: true, remaining: 3, tier: 'pro' });
  });

  it('is cleared by reset(key) in this process: the limiter’s, the store’s, and by a refund', async () => {
    const limiter = createLimiter({ store, limit: 1, windowMs: 60_000 });
    const k = key();
    const refuseFromCache = async () => {
      await limiter.check(k);
      await limiter.check(k);
      expect((await limiter.check(k)).cached).toBe(true);
    };
    await refuseFromCache();
    await limiter.reset(k);
    expect(await limiter.check(k)).toMatchObject({ allowed: true });
    await store.reset(k);
    await refuseFromCache();
    await store.reset(k);
    expect(await limiter.check(k)).toMatchObject({ allowed: true });
    expect((await limiter.check(k)).cached).toBeUndefined();
    expect((await limiter.check(k)).cached).toBe(true);
    await store.refund(k, 1);
    expect(await limiter.check(k)).toMatchObject({ allowed: true });
    expect((await limiter.check(k)).cached).toBeUndefined();
    await store.resetAll();
    expect(await limiter.check(k)).toMatchObject({ allowed: true });
    expect(limiter.stats().cacheEntries).toBe(0);
  });

  for (const [over, wrapped] of [
    ['redisStore', false],
    ['a store of another library over it (which tells the cache nothing)', true],
  ] as const) {
    it(`forgets a sliding refusal once the key is written under another windowMs, over ${over}`, async () => {
      const sliding = store.slidingWindow;
      const other = {
        shared: true,
        hit: store.hit.bind(store),
        slidingWindow: { consume: sliding.consume.bind(sliding), decrement: sliding.decrement.bind(sliding) },
      };
      const limiter = createLimiter({
        store: wrapped ? other : store,
        tiers: {
          a: { algorithm: 'sliding-window', limit: 1, windowMs: 7_000 },
          b: { algorithm: 'sliding-window', limit: 5, windowMs: 5_000 },
        },
      });
      const k = key();
      await limiter.check(k, { tier: 'a' });
      await limiter.check(k, { tier: 'a' });
      expect((await limiter.check(k, { tier: 'a' })).cached).toBe(true);
      await limiter.check(k, { tier: 'b' });
      const storeAllows = (await store.slidingWindow.consume(k, { limit: 1, windowMs: 7_000, cost: 0 })).remaining >= 1;
      const answer = await limiter.check(k, { tier: 'a' });
      expect(answer.cached).toBeUndefined();
      expect(answer.allowed).toBe(storeAllows);
    });
  }

  it('keeps no refusal answered while a refund of the key was under way', async () => {
    const limiter = createLimiter({ store, limit: 1, windowMs: 60_000 });
    const k = key();
    await limiter.check(k);
    // The refusal is sent first, the refund right behind it: the refusal's count is stale once it lands.
    const refused = limiter.check(k);
    const refund = store.refund(k, 1);
    expect((await refused).allowed).toBe(false);
    await refund;
    expect(await limiter.check(k)).toMatchObject({ allowed: true });
  });

  it('does not see a reset made by another process (another store object) until the refusal ends', async () => {
    const other = redisStore({ url: server.url, prefix: 'cache:' });
    try {
      const limiter = createLimiter({ store, limit: 1, windowMs: 60_000 });
      const k = key();
      await limiter.check(k);
      await limiter.check(k);
      await other.reset(k);
      expect(await limiter.check(k)).toMatchObject({ allowed: false, cached: true });
      // This process's own reset clears it.
      await limiter.reset(k);
      expect(await limiter.check(k)).toMatchObject({ allowed: true });
    } finally {
      await other.close();
    }
  });

  it('holds at most maxKeys refusals, dropping the oldest', async () => {
    const limiter = createLimiter({ store, limit: 1, windowMs: 60_000, blockCache: { maxKeys: 3 } });
    const keys = Array.from({ length: 5 }, key);
    for (const k of keys) {
      await limiter.check(k);
      await limiter.check(k);
    }
    expect(limiter.stats()).toMatchObject({ cacheEntries: 3, cacheEvictions: 2 });
    expect((await limiter.check(keys[0])).cached).toBeUndefined();
    expect((await limiter.check(keys[4])).cached).toBe(true);
  });

  it('under a flood costs Redis one script per key per window past the limit, on one key and on many', async () => {
    const limiter = createLimiter({ store, limit: 5, windowMs: 60_000 });
    const one = key();
    let before = await scripts();
    for (let i = 0; i < 500; i++) await limiter.check(one);
    expect(await scripts()).toBe(before + 6);
    const many = Array.from({ length: 200 }, key);
    before = await scripts();
    for (let round = 0; round < 20; round++) await Promise.all(many.map((k) => limiter.check(k)));
    expect(await scripts()).toBe(before + 200 * 6);
    expect(limiter.stats().cacheRefusals).toBe(494 + 200 * 14);
  });

  it('refuses bad options with a TypeError or RangeError', () => {
    const base = { store, limit: 1, windowMs: 1_000 };
    expect(() => createLimiter({ ...base, blockCache: 'yes' as never })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, blockCache: { maxKeys: 0 } })).toThrow(RangeError);
    expect(() => createLimiter({ ...base, blockCache: { maxKeys: 1.5 } })).toThrow(RangeError);
    expect(() => createLimiter({ ...base, blockCache: { size: 1 } as never })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, blockCache: { maxKeys: 10 } })).not.toThrow();
  });
});
