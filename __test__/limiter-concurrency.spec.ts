// Concurrency limits: at most N requests of a key in flight, each holding a lease its end gives back;
// a lease a crashed process never gave back ends after leaseMs. On memoryStore and a real redis-server.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, redisStore, type RatestoreStore, type RedisStore } from '../index.js';
import { startRedis, type RedisServer } from './support/redis.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let server: RedisServer;
let redis: RedisStore;

beforeAll(async () => {
  server = await startRedis();
  redis = redisStore({ url: server.url, prefix: 'leases:' });
});

afterAll(async () => {
  await redis?.close();
  await server?.stop();
});

/** Leases held now under `key` (each a fixed window of 1 at `key:lease:i`). */
async function held(store: RatestoreStore, key: string, n: number): Promise<number> {
  let count = 0;
  for (let i = 0; i < n; i++) count += (await store.hit(`${key}:lease:${i}`, 60_000, 0)).count;
  return count;
}

describe.each([
  ['memoryStore', () => memoryStore() as RatestoreStore],
  ['redisStore', () => redis as RatestoreStore],
])('a concurrency limit on %s', (_, make) => {
  it('lets at most limit requests hold a lease at once; a release lets the next one in', async () => {
    const store = make();
    const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 3, leaseMs: 60_000 });
    const k = randomUUID();
    const answers = await Promise.all(Array.from({ length: 6 }, () => limiter.check(k)));
    expect(answers.filter((a) => a.allowed)).toHaveLength(3);
    const refused = answers.find((a) => !a.allowed)!;
    expect(refused).toMatchObject({ limit: 3, remaining: 0 });
    expect(Number(refused.headers['Retry-After'])).toBeGreaterThanOrEqual(59);
    expect(await held(store, k, 3)).toBe(3);
    const holder = answers.find((a) => a.allowed)!;
    await holder.release!();
    await holder.release!(); // once only
    expect(await held(store, k, 3)).toBe(2);
    expect((await limiter.check(k)).allowed).toBe(true);
    expect((await limiter.check(k)).allowed).toBe(false);
    await refused.release!(); // holds none: changes nothing
    expect(await held(store, k, 3)).toBe(3);
  });

  it('ends a lease never given back after leaseMs, and a late release frees no other lease', async () => {
    const store = make();
    const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 1, leaseMs: 200 });
    const k = randomUUID();
    const crashed = await limiter.check(k);
    expect(crashed.allowed).toBe(true);
    expect((await limiter.check(k)).allowed).toBe(false);
    await sleep(260);
    const next = await limiter.check(k);
    expect(next.allowed).toBe(true);
    // The crashed request's release comes late: the lease it names has ended; the new one stays held.
    await crashed.release!();
    expect((await limiter.check(k)).allowed).toBe(false);
    await next.release!();
    expect((await limiter.check(k)).allowed).toBe(true);
  });

  it('beside a window: a request the window refuses gives its lease back at once', async () => {
    const store = make();
    const limiter = createLimiter({
      store,
      limits: [
        { name: 'inflight', algorithm: 'concurrency', limit: 2, leaseMs: 60_000 },
        { name: 'rate', limit: 1, windowMs: 60_000 },
      ],
    });
    const k = randomUUID();
    const first = await limiter.check(k);
    expect(first.allowed).toBe(true);
    const second = await limiter.check(k);
    expect(second.allowed).toBe(false);
    expect(second.limits.map((l) => [l.name, l.allowed])).toEqual([
      ['inflight', true],
      ['rate', false],
    ]);
    expect(await held(store, `${k}:inflight`, 2)).toBe(1);
    await first.release!();
    expect(await held(store, `${k}:inflight`, 2)).toBe(0);
    // reset(key) clears the leases too.
    await limiter.check(`${k}x`);
    await limiter.reset(`${k}x`);
    expect(await held(store, `${k}x:inflight`, 2)).toBe(0);
  });
});

describe('a concurrency limit at creation', () => {
  it('refuses bad options and a store with only hit', () => {
    const store = memoryStore();
    const make = (options: object) => () => createLimiter({ store, algorithm: 'concurrency', ...options } as never);
    expect(make({ limit: 0, leaseMs: 1_000 })).toThrow(RangeError);
    expect(make({ limit: 257, leaseMs: 1_000 })).toThrow(RangeError);
    expect(make({ limit: 2 })).toThrow(TypeError);
    expect(make({ limit: 2, leaseMs: 1_000, windowMs: 5 })).toThrow(/unknown option "windowMs"/);
    const hitOnly = { shared: false, hit: (k: string, w: number, a: number) => store.hit(k, w, a) };
    expect(() =>
      createLimiter({ store: hitOnly, algorithm: 'concurrency', limit: 2, leaseMs: 1_000 } as never),
    ).toThrow(TypeError);
  });
});

describe('answer.release()', () => {
  it('is on every answer, and does nothing where no lease is held', async () => {
    const store = memoryStore();
    const plain = createLimiter({ store, limit: 1, windowMs: 60_000 });
    const k = randomUUID();
    const allowed = await plain.check(k);
    const refused = await plain.check(k);
    for (const answer of [allowed, refused]) {
      expect(typeof answer.release).toBe('function');
      await expect(answer.release()).resolves.toBeUndefined();
    }
    // Nothing was given back: the window still holds its one request.
    expect((await plain.check(k)).allowed).toBe(false);
    expect((await store.hit(k, 60_000, 0)).count).toBe(1);
  });
});
