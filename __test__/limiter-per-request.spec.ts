// Limits and windows computed per request: a function of the key and the check's context, asked on
// every check, checked as options are, and never held by the block cache.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, type PerRequestInfo } from '../index.js';

type Plan = { plan: 'free' | 'pro' };
const byPlan = (_key: string, { context }: PerRequestInfo) => ((context as Plan).plan === 'pro' ? 5 : 2);

describe('per-request limits', () => {
  it('counts each request against the limit its function answers, in the headers too', async () => {
    const store = memoryStore();
    const limiter = createLimiter({ store, limit: byPlan, windowMs: 60_000, headers: 'draft-8' });
    const k = randomUUID();
    const free = { context: { plan: 'free' } satisfies Plan };
    const pro = { context: { plan: 'pro' } satisfies Plan };
    expect((await limiter.check(k, free)).allowed).toBe(true);
    expect((await limiter.check(k, free)).allowed).toBe(true);
    const refused = await limiter.check(k, free);
    expect(refused).toMatchObject({ allowed: false, limit: 2, remaining: 0 });
    // Upgraded: the same counter, under the pro limit.
    const upgraded = await limiter.check(k, pro);
    expect(upgraded).toMatchObject({ allowed: true, limit: 5, remaining: 2 });
    expect(upgraded.headers['RateLimit-Policy']).toBe('"per-request"; q=5; w=60');
    expect((await store.hit(k, 60_000, 0)).count).toBe(3);
  });

  it("computes a window's length per request, beside fixed limits", async () => {
    const store = memoryStore();
    const windowMs = (key: string) => (key.startsWith('short:') ? 200 : 60_000);
    const limiter = createLimiter({
      store,
      limits: [
        { name: 'burst', limit: 1, windowMs },
        { name: 'daily', limit: 100, windowMs: 86_400_000 },
      ],
    });
    const k = `short:${randomUUID()}`;
    expect((await limiter.check(k)).allowed).toBe(true);
    const refused = await limiter.check(k);
    expect(refused.allowed).toBe(false);
    expect(refused.limits[0]).toMatchObject({ windowMs: 200 });
    expect(refused.resetMs).toBeLessThanOrEqual(200);
    await new Promise((resolve) => setTimeout(resolve, 250));
    expect((await limiter.check(k)).allowed).toBe(true);
  });

  it('never caches a per-request refusal: another request of the key may have another limit', async () => {
    const limiter = createLimiter({ store: memoryStore(), limit: byPlan, windowMs: 60_000, blockCache: true });
    const k = randomUUID();
    for (let i = 0; i < 3; i++) await limiter.check(k, { context: { plan: 'free' } });
    expect((await limiter.check(k, { context: { plan: 'free' } })).cached).toBeUndefined();
    expect((await limiter.check(k, { context: { plan: 'pro' } })).allowed).toBe(true);
    expect(limiter.stats()).toMatchObject({ cacheEntries: 0, cacheRefusals: 0 });
  });

  it('rejects a check whose function answers out of range, counting nothing, failOpen or not', async () => {
    const store = memoryStore();
    for (const [answer, type] of [
      [-1, RangeError],
      [1.5, RangeError],
      [Number.NaN, RangeError],
      ['5', TypeError],
      [undefined, TypeError],
    ] as const) {
      const limiter = createLimiter({ store, limit: () => answer as number, windowMs: 60_000, failOpen: true });
      const k = randomUUID();
      const error = await limiter.check(k).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(type);
      expect((error as Error).message).toMatch(/^ratestore: check\(key\): limit\(key, info\) answered/);
      expect((error as Error).message).not.toContain(k);
      expect((await store.hit(k, 60_000, 0)).count).toBe(0);
    }
    const long = createLimiter({ store, limit: 1, windowMs: () => 2 ** 52 });
    await expect(long.check(randomUUID())).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
  });

  it('scales a per-request limit for the fallback, at least 1', async () => {
    const down = {
      shared: true,
      hit: async () => {
        throw Object.assign(new Error('ratestore: down'), { code: 'ERR_CONNECTION', sent: false });
      },
    };
    const limiter = createLimiter({
      store: down,
      fallback: { store: memoryStore(), scale: 1 / 2 },
      limit: byPlan,
      windowMs: 60_000,
    });
    const answer = await limiter.check(randomUUID(), { context: { plan: 'pro' } });
    expect(answer).toMatchObject({ allowed: true, fallback: true, limit: 2 });
    const free = await limiter.check(randomUUID(), { context: { plan: 'free' } });
    expect(free).toMatchObject({ allowed: true, fallback: true, limit: 1 });
  });
});
