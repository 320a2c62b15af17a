// createLimiter at its edges: long keys in the block cache, a store backing off, one key holding other
// data, bad input under failOpen, windows past the epoch's range, cached sliding refusals after their
// aligned window, third-party stores' malformed answers and missing reset, a scaled-down fallback,
// limits given with holes or inherited options. Real stores throughout (memoryStore, a redis-server).
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { createServer, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createLimiter,
  memoryStore,
  redisStore,
  type CounterHit,
  type RateLimitStore,
  type RedisStore,
} from '../index.js';
import { startRedis, type RedisServer } from './support/redis.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const MAX_KEY = 1024 * 1024;
const KEY_MARKER = '198.51.100.99-key-marker';

let server: RedisServer;
let store: RedisStore;

beforeAll(async () => {
  server = await startRedis();
  store = redisStore({ url: server.url, prefix: 'edges:' });
});

afterAll(async () => {
  await store?.close();
  await server?.stop();
});

/** A third-party store: hit alone, answering what `answer` makes of memoryStore's count. */
function thirdParty(answer: (hit: CounterHit) => unknown = (hit) => hit): RateLimitStore {
  const inner = memoryStore();
  return {
    shared: false,
    async hit(key, windowMs, amount) {
      return answer(await inner.hit(key, windowMs, amount)) as CounterHit;
    },
  };
}

/** A store whose every call fails unsent, as one that cannot connect. */
function down(): RateLimitStore {
  return {
    shared: true,
    hit: async () => {
      throw Object.assign(new Error('ratestore: redisStore: could not connect'), {
        code: 'ERR_CONNECTION',
        sent: false,
      });
    },
  };
}

describe('the block cache and long keys', () => {
  it('looks up a refusal of a 16,390-character key in well under a millisecond among 2,000 of them', async () => {
    const limiter = createLimiter({ store: memoryStore(), limit: 0, windowMs: 600_000, blockCache: true });
    const base = 'k'.repeat(16_380);
    const keys = Array.from({ length: 2_000 }, (_, i) => `${base}${String(i).padStart(10, '0')}`);
    for (const k of keys) await limiter.check(k);
    expect(limiter.stats().cacheEntries).toBe(2_000);
    const times: number[] = [];
    for (let i = 0; i < 41; i++) {
      const k = keys[(i * 37) % keys.length];
      const started = performance.now();
      const answer = await limiter.check(k);
      times.push(performance.now() - started);
      expect(answer.cached).toBe(true);
    }
    times.sort((a, b) => a - b);
    // A scan of 2,000 same-length keys took ~5 ms a lookup; a digest's lookup is one hash.
    expect(times[20]).toBeLessThan(2.5);
  });

  it('bounds the bytes it holds: a 1 MiB key is held as its digest, and maxBytes evicts the oldest', async () => {
    const limiter = createLimiter({ store: memoryStore(), limit: 0, windowMs: 600_000, blockCache: true });
    const huge = 'x'.repeat(MAX_KEY - 8);
    for (let i = 0; i < 20; i++) await limiter.check(`${huge}${String(i).padStart(8, '0')}`);
    const { cacheEntries, cacheBytes } = limiter.stats();
    expect(cacheEntries).toBe(20);
    expect(cacheBytes).toBeGreaterThan(0);
    expect(cacheBytes).toBeLessThan(20 * 1_024);
    expect((await limiter.check(`${huge}${String(3).padStart(8, '0')}`)).cached).toBe(true);

    const bounded = createLimiter({
      store: memoryStore(),
      limit: 0,
      windowMs: 600_000,
      blockCache: { maxBytes: 8_192 },
    });
    for (let i = 0; i < 200; i++) await bounded.check(`${'y'.repeat(200)}${i}`);
    const stats = bounded.stats();
    expect(stats.cacheBytes).toBeLessThanOrEqual(8_192);
    expect(stats.cacheEntries).toBeLessThan(200);
    expect(stats.cacheEvictions).toBe(200 - stats.cacheEntries);
  });

  it('refuses a maxBytes under 4,096 at creation', () => {
    expect(() => createLimiter({ store, limit: 1, windowMs: 1_000, blockCache: { maxBytes: 100 } })).toThrow(
      expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }),
    );
  });
});

describe('a store on the event loop backing off after a connection that ended before answering', () => {
  it('refuses calls meanwhile with sent: false, and a limiter with a fallback counts them there', async () => {
    // An endpoint that answers each connection's handshake (its PING) and closes it on the next bytes
    // it reads: the connection is up, and ends before it answered any call.
    const sockets: Socket[] = [];
    const endpoint = createServer((socket) => {
      sockets.push(socket);
      socket.on('error', () => {});
      socket.once('data', () => {
        socket.write('+PONG\r\n');
        socket.once('data', () => socket.destroy());
      });
    });
    await new Promise<void>((resolve) => endpoint.listen(0, '127.0.0.1', resolve));
    const { port } = endpoint.address() as { port: number };
    const requireCjs = createRequire(__filename);
    const { runtime } = requireCjs('../lib/runtime.js') as { runtime: { eventLoop: boolean } };
    const stores: RedisStore[] = [];
    try {
      // The event loop's transport (Node's default); the I/O thread's says the same (redis-faults.spec.ts).
      for (const eventLoop of [true]) {
        const before = runtime.eventLoop;
        runtime.eventLoop = eventLoop;
        let s: RedisStore;
        try {
          s = redisStore({ url: `redis://127.0.0.1:${port}`, prefix: 'edges-backoff:', timeoutMs: 1_000 });
        } finally {
          runtime.eventLoop = before;
        }
        stores.push(s);
        const first = await s.hit(KEY_MARKER, 60_000, 1).then(
          () => undefined,
          (e: { code: string; sent?: boolean; message: string }) => e,
        );
        // Sent (the connection was up), so it may have counted.
        expect([first?.code, first?.sent]).toEqual(['ERR_CONNECTION', true]);
        // Within the backoff (50 ms at least): refused at once, never sent.
        const refused = await s.hit(KEY_MARKER, 60_000, 1).then(
          () => undefined,
          (e: { code: string; sent?: boolean; message: string }) => e,
        );
        expect(refused?.message).toMatch(/backing off/);
        expect(refused?.message).not.toContain(KEY_MARKER);
        expect([eventLoop, refused?.sent]).toEqual([eventLoop, false]);
        const limiter = createLimiter({ store: s, fallback: memoryStore(), limit: 5, windowMs: 60_000 });
        const answer = await limiter.check(KEY_MARKER);
        expect(answer).toMatchObject({ allowed: true, fallback: true });
      }
    } finally {
      for (const s of stores) await s.close();
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => endpoint.close(resolve));
    }
  });
});

describe('a key holding other data', () => {
  it('rejects its own checks but never opens the fallback circuit for other keys', async () => {
    const errors: unknown[] = [];
    const limiter = createLimiter({
      store,
      fallback: memoryStore(),
      limit: 5,
      windowMs: 60_000,
      onError: (error) => errors.push(error),
    });
    const chosen = `chosen:${randomUUID()}`;
    await server.cli('HSET', `edges:${chosen}`, 'field', '1');
    const text = `text:${randomUUID()}`;
    await server.cli('SET', `edges:${text}`, 'not a number');
    for (const k of [chosen, text, chosen]) {
      const error = await limiter.check(k).then(
        () => undefined,
        (e: { code: string }) => e,
      );
      expect(error?.code).toBe('ERR_REDIS');
    }
    expect(limiter.stats().fallbackActive).toBe(false);
    const other = await limiter.check(randomUUID());
    expect(other).toMatchObject({ allowed: true });
    expect(other.fallback).toBeUndefined();
    expect(await server.cli('TYPE', `edges:${chosen}`)).toBe('hash');
    expect(errors).toHaveLength(3);
  });
});

describe('failOpen and bad input', () => {
  it('rejects a key over the length bound (with or without the limits suffixes), never allowing it', async () => {
    const one = createLimiter({ store: memoryStore(), limit: 5, windowMs: 60_000, failOpen: true });
    const error = await one.check('k'.repeat(MAX_KEY + 1)).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(RangeError);
    expect(error).toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
    const two = createLimiter({
      store: memoryStore(),
      failOpen: true,
      limits: [
        { name: 'burst', limit: 5, windowMs: 1_000 },
        { name: 'daily', limit: 50, windowMs: 86_400_000 },
      ],
    });
    // Within the bound itself, over it once ':daily' is added.
    const near = 'k'.repeat(MAX_KEY - 3);
    await expect(two.check(near)).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
    expect(two.stats().checks).toBe(0);
  });
});

describe('a fixed window past the epoch range', () => {
  it('throws a RangeError at creation on every store', () => {
    for (const s of [memoryStore(), store, thirdParty()]) {
      for (const windowMs of [Number.MAX_SAFE_INTEGER, 2 ** 53 - 1 - Date.now() + 1, 4_503_599_627_371]) {
        let thrown: unknown;
        try {
          createLimiter({ store: s, limit: 5, windowMs });
        } catch (e) {
          thrown = e;
        }
        expect(thrown).toBeInstanceOf(RangeError);
        expect(thrown).toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
        expect((thrown as Error).message).toMatch(/windowMs must be a safe integer of 1 or more up to 4503599627370/);
      }
      expect(() => createLimiter({ store: s, limit: 5, windowMs: 4_503_599_627_370 })).not.toThrow();
    }
  });
});

describe("a store's own limit-aware ops past the span bound", () => {
  it('reject with a RangeError and change nothing, on memoryStore and on Redis alike', async () => {
    const MAX_SPAN_MS = 4_503_599_627_370;
    for (const s of [memoryStore(), store]) {
      const k = `span:${randomUUID()}`;
      for (const windowMs of [Number.MAX_SAFE_INTEGER, MAX_SPAN_MS + 1]) {
        const calls = [
          () => s.consume(k, { limit: 10, windowMs, cost: 1 }),
          () => s.slidingWindow.increment(k, windowMs, 1),
          () => s.slidingWindow.decrement(k, windowMs, 1),
          () => s.slidingWindow.consume(k, { limit: 10, windowMs, cost: 1 }),
          () => s.tokenBucket(k, { capacity: 1, refill: 1, intervalMs: windowMs }),
          () => s.tokenBucket(k, { capacity: 3, refill: 1, intervalMs: Math.floor(MAX_SPAN_MS / 2) }),
        ];
        for (const call of calls) {
          await expect(call()).rejects.toMatchObject({ name: 'RangeError', code: 'ERR_OUT_OF_RANGE' });
        }
      }
      // Nothing was written: each algorithm's state of the key is still empty.
      expect((await s.hit(k, 60_000, 0)).count).toBe(0);
      expect((await s.slidingWindow.increment(k, 60_000, 0)).count).toBe(0);
      expect((await s.tokenBucket(k, { capacity: 5, refill: 1, intervalMs: 1_000, cost: 0 })).remaining).toBe(5);
      // The bound itself is accepted, the same on both.
      expect((await s.consume(k, { limit: 10, windowMs: MAX_SPAN_MS, cost: 1 })).count).toBe(1);
    }
  });
});

describe('a cached sliding-window refusal', () => {
  it("answers the aligned window now current's reset once the one the store answered ended", async () => {
    const windowMs = 1_000;
    const limiter = createLimiter({ store, algorithm: 'sliding-window', limit: 1, windowMs });
    const k = `sliding:${randomUUID()}`;
    expect((await limiter.check(k)).allowed).toBe(true);
    const refused = await limiter.check(k);
    expect(refused.allowed).toBe(false);
    // The previous window weighs 1 until the next one ends, so the refusal lasts past this window's end.
    await sleep(refused.resetMs + 60);
    const cached = await limiter.check(k);
    expect(cached).toMatchObject({ allowed: false, cached: true });
    expect(cached.resetMs).toBeGreaterThan(windowMs - 250);
    expect(cached.resetMs).toBeLessThanOrEqual(windowMs);
    expect(cached.headers['RateLimit-Reset']).toBe('1');
  });
});

describe("a third-party store's answers", () => {
  it('rejects a hit answered without a usable resetMs or count, never a refusal without Retry-After', async () => {
    for (const make of [
      (hit: CounterHit) => ({ count: hit.count }),
      (hit: CounterHit) => ({ count: hit.count, resetMs: Number.NaN }),
      (hit: CounterHit) => ({ count: String(hit.count), resetMs: hit.resetMs }),
      () => null,
    ]) {
      const limiter = createLimiter({ store: thirdParty(make), limit: 1, windowMs: 60_000 });
      const k = randomUUID();
      const answers = await Promise.allSettled([limiter.check(k), limiter.check(k)]);
      for (const answer of answers) {
        expect(answer.status).toBe('rejected');
        expect((answer as PromiseRejectedResult).reason).toMatchObject({ code: 'ERR_STORE_ANSWER' });
        expect((answer as PromiseRejectedResult).reason.message).toMatch(/^ratestore: /);
      }
    }
    // resetMs 0 on a refusal: Retry-After 1.
    const zero = createLimiter({ store: thirdParty((hit) => ({ ...hit, resetMs: 0 })), limit: 1, windowMs: 60_000 });
    const k = randomUUID();
    await zero.check(k);
    const refused = await zero.check(k);
    expect(refused).toMatchObject({ allowed: false, retryAfter: 1 });
    expect(refused.headers['Retry-After']).toBe('1');
  });

  it('limiter.reset over a store with only hit rejects with ERR_UNSUPPORTED, saying why, resetting nothing', async () => {
    const inner = memoryStore();
    const hitOnly: RateLimitStore = { shared: false, hit: (k, w, a) => inner.hit(k, w, a) };
    const limiter = createLimiter({ store: hitOnly, fallback: memoryStore(), limit: 1, windowMs: 60_000 });
    const k = randomUUID();
    await limiter.check(k);
    const error = await limiter.reset(k).then(
      () => undefined,
      (e: Error & { code: string }) => e,
    );
    expect(error?.code).toBe('ERR_UNSUPPORTED');
    expect(error?.message).toMatch(/^ratestore: limiter.reset\(key\): the store has no reset\(key\)/);
    expect(error?.message).not.toContain(k);
    expect((await inner.hit(k, 60_000, 0)).count).toBe(1);
  });
});

describe('a scaled-down fallback', () => {
  it('floors a window limit at 1, as a bucket is', async () => {
    const limiter = createLimiter({
      store: down(),
      fallback: { store: memoryStore(), scale: 1 / 4 },
      limit: 3,
      windowMs: 60_000,
    });
    const k = randomUUID();
    const first = await limiter.check(k);
    expect(first).toMatchObject({ allowed: true, fallback: true, limit: 1 });
    expect(await limiter.check(k)).toMatchObject({ allowed: false, fallback: true, limit: 1 });
    // A limit of 0 stays 0.
    const none = createLimiter({
      store: down(),
      fallback: { store: memoryStore(), scale: 1 / 4 },
      limit: 0,
      windowMs: 60_000,
    });
    expect(await none.check(k)).toMatchObject({ allowed: false, fallback: true, limit: 0 });
  });
});

describe('limits and options given oddly', () => {
  it('throws a TypeError with a code for a hole in a list of limits', () => {
    const store = memoryStore();
    // eslint-disable-next-line no-sparse-arrays
    for (const options of [
      { store, limits: [, { limit: 1, windowMs: 1_000 }] },
      { store, tiers: { pro: [, { limit: 1, windowMs: 1_000 }] } },
    ]) {
      let thrown: unknown;
      try {
        createLimiter(options as never);
      } catch (e) {
        thrown = e;
      }
      expect(thrown).toBeInstanceOf(TypeError);
      expect(thrown).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' });
      expect((thrown as Error).message).toMatch(/\[0\] must be a limit, got a hole/);
    }
  });

  it('reads only the check options given: an inherited tier rejects with a code, changing nothing', async () => {
    const inner = memoryStore();
    const limiter = createLimiter({ store: inner, tiers: { pro: { limit: 1, windowMs: 60_000 } } });
    const k = randomUUID();
    const how = Object.create({ tier: 'pro' }) as { tier: 'pro' };
    const error = await limiter.check(k, how).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(TypeError);
    expect(error).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' });
    expect((await inner.hit(k, 60_000, 0)).count).toBe(0);
  });
});
