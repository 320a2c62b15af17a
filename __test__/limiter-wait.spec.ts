// limiter.wait: resolves once a request would be allowed, or rejects at the timeout, sleeping until
// the time each refusal named rather than polling the store.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, sqliteStore } from '../index.js';

describe('limiter.wait', () => {
  it('resolves when the window ends, with one store call per refusal', async () => {
    const store = memoryStore();
    const limiter = createLimiter({ store, limit: 2, windowMs: 300 });
    const k = randomUUID();
    await limiter.check(k);
    await limiter.check(k);
    const calls = store.stats().calls;
    const started = performance.now();
    const answer = await limiter.wait(k, { timeoutMs: 2_000 });
    const waited = performance.now() - started;
    expect(answer.allowed).toBe(true);
    expect(waited).toBeGreaterThan(150);
    expect(waited).toBeLessThan(1_500);
    // The refusal, then the check after the window's end: no loop of calls.
    expect(store.stats().calls - calls).toBeLessThanOrEqual(3);
  });

  it('rejects with ERR_TIMEOUT at the timeout, having counted nothing', async () => {
    const store = memoryStore();
    const limiter = createLimiter({
      store,
      limits: [
        { name: 'a', limit: 1, windowMs: 60_000 },
        { name: 'b', algorithm: 'sliding-window', limit: 5, windowMs: 60_000 },
      ],
    });
    const k = randomUUID();
    await limiter.check(k);
    const calls = store.stats().calls;
    const started = performance.now();
    const error = await limiter.wait(k, { timeoutMs: 200 }).then(
      () => undefined,
      (e: Error & { code: string }) => e,
    );
    const waited = performance.now() - started;
    expect(error?.code).toBe('ERR_TIMEOUT');
    expect(error?.message).toMatch(/^ratestore: limiter.wait\(key, options\): the request was not allowed within/);
    expect(error?.message).not.toContain(k);
    expect(waited).toBeGreaterThan(180);
    expect(waited).toBeLessThan(2_000);
    // Two checks (the first and one at the deadline), two limits each.
    expect(store.stats().calls - calls).toBeLessThanOrEqual(4);
    expect((await store.slidingWindow.increment(`${k}:b`, 60_000, 0)).count).toBe(1);
  });

  it('behind a concurrency limit, wakes when a request of the process gives its lease back', async () => {
    for (const store of [memoryStore(), sqliteStore({ path: ':memory:' })]) {
      const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 2, leaseMs: 30_000 });
      const k = randomUUID();
      const one = await limiter.check(k);
      const two = await limiter.check(k);
      expect([one.allowed, two.allowed]).toEqual([true, true]);
      const started = performance.now();
      const waiting = limiter.wait(k, { timeoutMs: 10_000 });
      const other = limiter.wait(`${k}:other`, { timeoutMs: 10_000 });
      setTimeout(() => void one.release?.(), 150);
      const answer = await waiting;
      const waited = performance.now() - started;
      expect(answer.allowed).toBe(true);
      // Woken by the release, not by the lease's end 30 s on.
      expect(waited).toBeGreaterThan(100);
      expect(waited).toBeLessThan(5_000);
      // Another key's wait was allowed at once; the third request now holds the freed lease.
      expect((await other).allowed).toBe(true);
      expect((await limiter.check(k)).allowed).toBe(false);
      await answer.release?.();
      await two.release?.();
      await (store as { close?: () => Promise<void> }).close?.();
    }
  });

  it('times out behind a concurrency limit no request gives back, with no loop of store calls', async () => {
    const store = memoryStore();
    const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 1, leaseMs: 30_000 });
    const k = randomUUID();
    expect((await limiter.check(k)).allowed).toBe(true);
    const calls = store.stats().calls;
    const error = await limiter.wait(k, { timeoutMs: 300 }).then(
      () => undefined,
      (e: Error & { code: string }) => e,
    );
    expect(error?.code).toBe('ERR_TIMEOUT');
    // The refusal and the check at the deadline, one lease each (and, on a loaded machine, one more
    // check where the timer fired a little before it): no loop, which would make dozens in 300 ms.
    expect(store.stats().calls - calls).toBeLessThanOrEqual(3);
  });

  it('resolves at once when allowed, and checks its arguments', async () => {
    const limiter = createLimiter({ store: memoryStore(), tiers: { pro: { limit: 5, windowMs: 1_000 } } });
    const k = randomUUID();
    expect(await limiter.wait(k, { timeoutMs: 0, tier: 'pro', cost: 2 })).toMatchObject({
      allowed: true,
      remaining: 3,
      tier: 'pro',
    });
    const wait = limiter.wait as (key: unknown, options?: unknown) => Promise<unknown>;
    await expect(wait(k, { tier: 'pro' })).rejects.toBeInstanceOf(TypeError);
    await expect(wait(k, { timeoutMs: -1, tier: 'pro' })).rejects.toBeInstanceOf(RangeError);
    await expect(wait(k, { timeoutMs: 10, tier: 'gold' })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
    await expect(wait(k, { timeoutMs: 10, tier: 'pro', every: 1 })).rejects.toThrow(/unknown option "every"/);
    await expect(wait(42, { timeoutMs: 10, tier: 'pro' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' });
  });
});
