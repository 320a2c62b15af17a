import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, type CounterHit, type RateLimitStore } from '../index.js';
import { limiterSuite } from './limiter-suite.js';

limiterSuite('memoryStore', () => memoryStore());

const failing: RateLimitStore = {
  shared: true,
  hit: (): Promise<CounterHit> => Promise.reject(Object.assign(new Error('store down'), { code: 'ERR_CONNECTION' })),
};

describe('createLimiter', () => {
  it('propagates a store error by default', async () => {
    const limiter = createLimiter({ store: failing, limit: 1, windowMs: 1000 });
    await expect(limiter.check('k')).rejects.toThrow('store down');
  });

  it('allows on a store error only when failOpen is set, and says why', async () => {
    const limiter = createLimiter({ store: failing, limit: 1, windowMs: 1000, failOpen: true });
    const answer = await limiter.check('k');
    expect(answer.allowed).toBe(true);
    expect((answer.error as Error).message).toBe('store down');
  });

  it('checks its options and the cost', async () => {
    const make = createLimiter as (options: unknown) => unknown;
    const store = memoryStore();
    expect(() => make({ limit: 1, windowMs: 1 })).toThrow(TypeError);
    expect(() => make({ store, limit: -1, windowMs: 1 })).toThrow(RangeError);
    expect(() => make({ store, limit: 1, windowMs: 0 })).toThrow(RangeError);
    expect(() => make({ store, limit: 1, windowMs: 1, max: 3 })).toThrow(/unknown option/);
    const limiter = createLimiter({ store, limit: 1, windowMs: 1000 });
    await expect(limiter.check('k', 0)).rejects.toBeInstanceOf(RangeError);
    await expect(limiter.check('k', 1.5)).rejects.toBeInstanceOf(RangeError);
    expect((await store.hit('k', 1000, 0)).count).toBe(0);
  });
});
