// createLimiter's behaviour over a given store: every store runs it.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, type RateLimitStore } from '../index.js';

export function limiterSuite(name: string, create: () => RateLimitStore): void {
  describe(`createLimiter over ${name}`, () => {
    const key = () => `limiter:${randomUUID()}`;

    it('allows up to the limit with headers, then refuses with Retry-After', async () => {
      const limiter = createLimiter({ store: create(), limit: 3, windowMs: 10_000 });
      const k = key();
      const answers = [];
      for (let i = 0; i < 4; i++) answers.push(await limiter.check(k));
      expect(answers.map((a) => a.allowed)).toEqual([true, true, true, false]);
      expect(answers.map((a) => a.remaining)).toEqual([2, 1, 0, 0]);
      expect(answers[0].headers).toEqual({
        'RateLimit-Limit': '3',
        'RateLimit-Remaining': '2',
        'RateLimit-Reset': '10',
      });
      expect(answers[0].retryAfter).toBe(0);
      const refused = answers[3];
      expect(refused.retryAfter).toBeGreaterThanOrEqual(1);
      expect(refused.retryAfter).toBeLessThanOrEqual(10);
      expect(refused.headers['Retry-After']).toBe(String(refused.retryAfter));
      expect(refused.headers['RateLimit-Remaining']).toBe('0');
    });

    it('charges a refused request nothing', async () => {
      const store = create();
      const limiter = createLimiter({ store, limit: 2, windowMs: 10_000 });
      const k = key();
      await limiter.check(k);
      await limiter.check(k);
      for (let i = 0; i < 5; i++) expect((await limiter.check(k)).allowed).toBe(false);
      expect((await store.hit(k, 10_000, 0)).count).toBe(2);
      expect((await limiter.check(k, 5)).allowed).toBe(false);
      expect((await store.hit(k, 10_000, 0)).count).toBe(2);
    });

    it('counts a cost, and answers Retry-After of at least 1 second near the window end', async () => {
      const limiter = createLimiter({ store: create(), limit: 10, windowMs: 300 });
      const k = key();
      expect((await limiter.check(k, 10)).remaining).toBe(0);
      const refused = await limiter.check(k);
      expect(refused.allowed).toBe(false);
      expect(refused.retryAfter).toBe(1);
      expect(refused.headers['RateLimit-Reset']).toBe('1');
      await new Promise((resolve) => setTimeout(resolve, 350));
      expect((await limiter.check(k)).allowed).toBe(true);
    });

    it('admits exactly the limit under concurrency', async () => {
      const limiter = createLimiter({ store: create(), limit: 25, windowMs: 10_000 });
      const k = key();
      const answers = await Promise.all(Array.from({ length: 100 }, () => limiter.check(k)));
      expect(answers.filter((a) => a.allowed)).toHaveLength(25);
    });
  });
}
