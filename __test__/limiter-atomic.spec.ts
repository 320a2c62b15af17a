// Several limits as one step: on memoryStore a check takes from every limit or from none, in one
// critical section, so a refused check never makes another one fail for room it only briefly held.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore } from '../index.js';

const DAY = 86_400_000;

describe('several limits as one step on memoryStore', () => {
  it('burst 7 and daily 20, and a limiter of the daily limit alone at once: daily lets exactly 20 through', async () => {
    const store = memoryStore();
    const both = createLimiter({
      store,
      limits: [
        { name: 'burst', limit: 7, windowMs: 600_000 },
        { name: 'daily', limit: 20, windowMs: DAY },
      ],
    });
    // The daily limit alone, on the same counter (`key + ':daily'`).
    const daily = createLimiter({ store, limit: 20, windowMs: DAY });
    const k = `user:${randomUUID()}`;
    const checks = [];
    for (let i = 0; i < 40; i++) {
      checks.push(both.check(k).then((a) => ['both', a.allowed] as const));
      checks.push(daily.check(`${k}:daily`).then((a) => ['daily', a.allowed] as const));
    }
    const answers = await Promise.all(checks);
    const allowed = (who: string) => answers.filter(([w, ok]) => w === who && ok).length;
    expect(allowed('both')).toBe(7);
    expect(allowed('both') + allowed('daily')).toBe(20);
    expect((await store.hit(`${k}:daily`, DAY, 0)).count).toBe(20);
    expect((await store.hit(`${k}:burst`, 600_000, 0)).count).toBe(7);
  });

  it('a refused check takes nothing from the limits that would have allowed, the bucket included', async () => {
    const store = memoryStore();
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
    // As each found its key: the sliding window left as the first check left it; the bucket, after a
    // window's refusal, reported as configured (as when it is asked last).
    expect(refused.limits.map((l) => [l.name, l.allowed, l.remaining])).toEqual([
      ['burst', false, 0],
      ['sliding', true, 9],
      ['bucket', true, 5],
    ]);
    expect(refused.headers['Retry-After']).toBe('60');
    expect((await store.slidingWindow.increment(`${k}:sliding`, 60_000, 0)).count).toBe(1);
    const bucket = await store.tokenBucket(`${k}:bucket`, { capacity: 5, refill: 1, intervalMs: 60_000, cost: 0 });
    expect(bucket.remaining).toBe(4);
  });

  it('rejects, changing nothing, when the store is closed', async () => {
    const store = memoryStore();
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
