// The model of docs/algorithms.md against the documents' own cases: the tables of docs/algorithms.md,
// the shared store rules, and seed 004's sliding estimate (ceil(previousHits * weight + currentHits)).
import { describe, expect, it } from 'vitest';
import { Model, US } from './support/model.js';

const T = 1_700_000_000_000 * US; // an epoch µs on a whole second

describe('model: fixed window', () => {
  it('consume adds cost only within the limit; a refusal changes nothing; cost 0 reads', () => {
    const m = new Model();
    expect(m.consume('k', { limit: 2, windowMs: 100, cost: 2 }, T)).toEqual({
      allowed: true,
      count: 2,
      remaining: 0,
      resetMs: 100,
    });
    expect(m.consume('k', { limit: 2, windowMs: 100 }, T + 10 * US)).toEqual({
      allowed: false,
      count: 2,
      remaining: 0,
      resetMs: 90,
    });
    expect(m.consume('k', { limit: 2, windowMs: 100, cost: 0 }, T + 10 * US).allowed).toBe(true);
    // cost above the limit: refused with no window, resetMs = windowMs
    expect(m.consume('j', { limit: 1, windowMs: 50, cost: 2 }, T)).toEqual({
      allowed: false,
      count: 0,
      remaining: 1,
      resetMs: 50,
    });
    expect(m.consume('z', { limit: 0, windowMs: 50, cost: 1 }, T).allowed).toBe(false);
  });

  it('a window opened at t lasts windowMs, also at windowMs 1: two consumes in one ms allow one', () => {
    const m = new Model();
    expect(m.consume('k', { limit: 1, windowMs: 1 }, T + 100).allowed).toBe(true);
    expect(m.consume('k', { limit: 1, windowMs: 1 }, T + 900).allowed).toBe(false);
    expect(m.consume('k', { limit: 1, windowMs: 1 }, T + 1000).allowed).toBe(true);
  });

  it('refund never opens a window and never goes below 0; hit is not clamped', () => {
    const m = new Model();
    expect(m.refund('k', 1, T)).toBeNull();
    m.hit('k', 100, 2, T);
    expect(m.refund('k', 5, T + US)).toEqual({ count: 0, resetMs: 99 });
    expect(m.hit('k', 100, -3, T + 2 * US)).toEqual({ count: -3, resetMs: 98 });
    expect(m.refund('k', 1, T + 3 * US)).toEqual({ count: -3, resetMs: 97 });
    expect(m.refund('k', 1, T + 100 * US)).toBeNull();
    expect(m.hit('k', 100, 0, T + 100 * US)).toEqual({ count: 0, resetMs: 100 });
  });
});

describe('model: sliding window (ceil, epoch-aligned)', () => {
  it('limit 10 with 10 in the previous window, 25% in: 2 more pass (the seed), not 3', () => {
    const m = new Model();
    m.slidingIncrement('k', 1000, 10, T + 500 * US);
    let allowed = 0;
    for (let i = 0; i < 5; i++)
      if (m.slidingConsume('k', { limit: 10, windowMs: 1000 }, T + 1250 * US).allowed) allowed++;
    expect(allowed).toBe(2);
  });

  it('limit 1: a request 10 ms before an edge refuses one 10 ms after', () => {
    const m = new Model();
    expect(m.slidingConsume('k', { limit: 1, windowMs: 1000 }, T + 990 * US).allowed).toBe(true);
    expect(m.slidingConsume('k', { limit: 1, windowMs: 1000 }, T + 1010 * US).allowed).toBe(false);
  });

  it('10 increments just after a second, one more at +1.25 s: the estimate is 9 (ceil(10 * 0.75) + 1)', () => {
    const m = new Model();
    for (let i = 0; i < 10; i++) m.slidingIncrement('k', 1000, 1, T + 10 * US);
    expect(m.slidingIncrement('k', 1000, 1, T + 1250 * US)).toEqual({ count: 9, resetMs: 750 });
  });

  it('a state read with another windowMs counts only if its start lines up', () => {
    const m = new Model();
    m.slidingIncrement('k', 1000, 5, T + 10 * US);
    expect(m.slidingIncrement('k', 100, 0, T + 510 * US).count).toBe(0);
    expect(m.slidingIncrement('k', 1000, 0, T + 510 * US).count).toBe(5);
  });

  it('decrement takes from the current window first, then the previous; never creates a state', () => {
    const m = new Model();
    expect(m.slidingDecrement('n', 1000, 1, T).count).toBe(0);
    expect(m.sliding.has('n')).toBe(false);
    m.slidingIncrement('k', 1000, 4, T + 900 * US);
    m.slidingIncrement('k', 1000, 1, T + 1000 * US);
    expect(m.slidingDecrement('k', 1000, 2, T + 1000 * US).count).toBe(3);
    expect(m.sliding.get('k')).toEqual({ start: T + 1000 * US, previous: 3, current: 0, ends: T + 2000 * US });
  });

  it('a state read under another windowMs counts in full while it starts inside the window, and until its own end', () => {
    const m = new Model();
    // Written under 10 ms at T + 5 ms: start T, counting until T + 20 ms.
    m.slidingIncrement('k', 10, 2, T + 5 * US);
    expect(m.slidingIncrement('k', 1000, 0, T + 8 * US).count).toBe(2);
    // A decrement under 5 ms finds nothing in its windows, takes nothing, and leaves the state alone.
    expect(m.slidingDecrement('k', 5, 1, T + 12 * US).count).toBe(0);
    expect(m.slidingIncrement('k', 10, 0, T + 12 * US).count).toBe(2);
    // Past its own end it counts nothing, whatever the windowMs.
    expect(m.slidingIncrement('k', 1000, 0, T + 20 * US).count).toBe(0);
  });
});

describe('model: token bucket', () => {
  it('takes, refuses with the time until the cost is in, refills whole', () => {
    const m = new Model();
    const o = { capacity: 2, refill: 1, intervalMs: 100 };
    expect(m.tokenBucket('k', { ...o, cost: 2 }, T)).toEqual({ allowed: true, remaining: 0, retryMs: 0, resetMs: 200 });
    expect(m.tokenBucket('k', o, T + 50 * US)).toEqual({ allowed: false, remaining: 0, retryMs: 50, resetMs: 150 });
    expect(m.tokenBucket('k', o, T + 100 * US)).toEqual({ allowed: true, remaining: 0, retryMs: 0, resetMs: 200 });
    expect(m.tokenBucket('k', { ...o, cost: 3 }, T + 100 * US).allowed).toBe(false);
    expect(m.tokenBucket('k', { ...o, cost: 0 }, T + 300 * US)).toEqual({
      allowed: true,
      remaining: 2,
      retryMs: 0,
      resetMs: 0,
    });
    expect(m.bucket.has('k')).toBe(false);
  });
});

describe('model: reset', () => {
  it('reset removes every algorithm of a key; resetAll every key', () => {
    const m = new Model();
    m.hit('a', 100, 1, T);
    m.slidingIncrement('a', 100, 1, T);
    m.tokenBucket('a', { capacity: 2, refill: 1, intervalMs: 100 }, T);
    m.hit('b', 100, 1, T);
    m.reset('a');
    expect(m.hit('a', 100, 0, T).count).toBe(0);
    expect(m.slidingIncrement('a', 100, 0, T).count).toBe(0);
    expect(m.hit('b', 100, 0, T).count).toBe(1);
    m.resetAll();
    expect(m.signature()).toBe(new Model().signature());
  });
});
