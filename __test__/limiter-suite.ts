// createLimiter's behaviour over a given store: every store runs it. On ratestore's stores the
// limiter uses consume and refund; on a store with only hit (a third-party RateLimitStore) it hits
// and gives back, and the algorithms beyond the fixed window are refused at creation.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, type RateLimitStore, type RatestoreStore } from '../index.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function isRatestore(store: RateLimitStore): store is RatestoreStore {
  return typeof (store as Partial<RatestoreStore>).consume === 'function';
}

/** Whether a store runs several takes as one step (offers `store[TAKES]`, lib/ops.js). */
function takesOneStep(store: RateLimitStore): boolean {
  for (
    let proto = Object.getPrototypeOf(store) as object | null;
    proto !== null;
    proto = Object.getPrototypeOf(proto)
  ) {
    if (Object.getOwnPropertySymbols(proto).some((s) => s.description === 'ratestore.takes')) return true;
  }
  return false;
}

/**
 * `hitOnly`: the store offers the contract's `hit` alone (a third-party store), so the cases that need
 * ratestore's operations are not run on it, and the ones about refusing them are.
 */
export function limiterSuite(name: string, create: () => RateLimitStore, { hitOnly = false } = {}): void {
  describe(`createLimiter over ${name}`, () => {
    const key = () => `limiter:${randomUUID()}`;
    const count = async (store: RateLimitStore, k: string, windowMs: number) => (await store.hit(k, windowMs, 0)).count;

    it('allows up to the limit with headers, then refuses with Retry-After', async () => {
      const limiter = createLimiter({ store: create(), limit: 3, windowMs: 10_000 });
      const k = key();
      const answers = [];
      for (let i = 0; i < 4; i++) answers.push(await limiter.check(k));
      expect(answers.map((a) => a.allowed)).toEqual([true, true, true, false]);
      expect(answers.map((a) => a.remaining)).toEqual([2, 1, 0, 0]);
      expect(answers[0].headers).toEqual({
        'RateLimit-Policy': '3;w=10',
        'RateLimit-Limit': '3',
        'RateLimit-Remaining': '2',
        'RateLimit-Reset': '10',
      });
      expect(answers[0]).toMatchObject({ limit: 3, retryAfter: 0 });
      expect(answers[0].resetAt).toBeGreaterThan(Date.now() + 9_000);
      expect(answers[0].resetAt).toBeLessThanOrEqual(Date.now() + 10_000);
      const refused = answers[3];
      expect(refused.retryAfter).toBeGreaterThanOrEqual(1);
      expect(refused.retryAfter).toBeLessThanOrEqual(10);
      expect(refused.headers['Retry-After']).toBe(String(refused.retryAfter));
      expect(refused.headers['RateLimit-Remaining']).toBe('0');
      expect(refused.limits).toEqual([expect.objectContaining({ name: '3-in-10sec', allowed: false, remaining: 0 })]);
    });

    it(`charges a refused request ${hitOnly ? 'its hit, never given back' : 'nothing'}`, async () => {
      const store = create();
      const limiter = createLimiter({ store, limit: 2, windowMs: 10_000 });
      const k = key();
      await limiter.check(k);
      await limiter.check(k);
      for (let i = 0; i < 5; i++) expect((await limiter.check(k)).allowed).toBe(false);
      expect(await count(store, k, 10_000)).toBe(hitOnly ? 7 : 2);
      expect((await limiter.check(k, 5)).allowed).toBe(false);
      expect(await count(store, k, 10_000)).toBe(hitOnly ? 12 : 2);
    });

    it('counts a cost, and answers Retry-After of at least 1 second near the window end', async () => {
      const limiter = createLimiter({ store: create(), limit: 10, windowMs: 300 });
      const k = key();
      expect((await limiter.check(k, { cost: 10 })).remaining).toBe(0);
      const refused = await limiter.check(k);
      expect(refused.allowed).toBe(false);
      expect(refused.retryAfter).toBe(1);
      expect(refused.headers['RateLimit-Reset']).toBe('1');
      await sleep(350);
      expect((await limiter.check(k)).allowed).toBe(true);
    });

    it('admits exactly the limit under concurrency', async () => {
      const limiter = createLimiter({ store: create(), limit: 25, windowMs: 10_000 });
      const k = key();
      const answers = await Promise.all(Array.from({ length: 100 }, () => limiter.check(k)));
      expect(answers.filter((a) => a.allowed)).toHaveLength(25);
    });

    it('passes a request only if every limit allows, and a refusal leaves every limit as it was', async () => {
      const store = create();
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'burst', limit: 2, windowMs: 10_000 },
          { name: 'daily', limit: 3, windowMs: 86_400_000 },
        ],
        headers: 'draft-8',
      });
      const k = key();
      expect((await limiter.check(k)).allowed).toBe(true);
      const second = await limiter.check(k);
      expect(second.allowed).toBe(true);
      // The burst limit is the one closest to refusing.
      expect(second).toMatchObject({ limit: 2, remaining: 0 });
      expect(second.headers).toEqual({
        RateLimit: '"burst"; r=0; t=10, "daily"; r=1; t=86400',
        'RateLimit-Policy': '"burst"; q=2; w=10, "daily"; q=3; w=86400',
      });
      // Refused by the burst limit: the daily quota took the cost and gave it back (over a store with
      // only hit, nothing is given back: the hits stay counted).
      const third = await limiter.check(k);
      expect(third.allowed).toBe(false);
      expect(third.limits.map((l) => [l.name, l.allowed, l.remaining])).toEqual([
        ['burst', false, 0],
        ['daily', true, hitOnly ? 0 : 1],
      ]);
      expect(third.headers['Retry-After']).toBe(String(third.retryAfter));
      expect(await count(store, `${k}:burst`, 10_000)).toBe(hitOnly ? 3 : 2);
      expect(await count(store, `${k}:daily`, 86_400_000)).toBe(hitOnly ? 3 : 2);

      // Refused by the second limit: the first gives its cost back.
      const quota = createLimiter({
        store,
        limits: [
          { name: 'burst', limit: 10, windowMs: 10_000 },
          { name: 'daily', limit: 1, windowMs: 86_400_000 },
        ],
      });
      const q = key();
      expect((await quota.check(q)).allowed).toBe(true);
      const refused = await quota.check(q);
      expect(refused).toMatchObject({ allowed: false, limit: 1, remaining: 0 });
      expect(refused.retryAfter).toBeGreaterThan(86_000);
      expect(await count(store, `${q}:burst`, 10_000)).toBe(hitOnly ? 2 : 1);
      expect(await count(store, `${q}:daily`, 86_400_000)).toBe(hitOnly ? 2 : 1);
    });

    it('admits exactly the tightest limit under concurrency, with several limits', async () => {
      const store = create();
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'a', limit: 30, windowMs: 10_000 },
          { name: 'b', limit: 20, windowMs: 10_000 },
        ],
      });
      const k = key();
      const answers = await Promise.all(Array.from({ length: 60 }, () => limiter.check(k)));
      // A refused request's cost is given back only after it was counted, so a concurrent request
      // may be refused while it is: never more than the tightest limit pass. Over a store with only
      // hit nothing is given back, so every hit stays counted.
      const passed = answers.filter((a) => a.allowed).length;
      expect(passed).toBeGreaterThan(0);
      expect(passed).toBeLessThanOrEqual(20);
      expect(await count(store, `${k}:b`, 10_000)).toBe(hitOnly ? 60 : passed);
      expect(await count(store, `${k}:a`, 10_000)).toBe(hitOnly ? 60 : passed);
    });

    it("checks a key's tier: each tier with its own limits", async () => {
      const store = create();
      const limiter = createLimiter({
        store,
        tiers: {
          anon: { limit: 1, windowMs: 60_000 },
          free: { limit: 3, windowMs: 60_000 },
          pro: [
            { name: 'burst', limit: 5, windowMs: 1_000 },
            { name: 'daily', limit: 100, windowMs: 86_400_000 },
          ],
          admin: { limit: 1_000, windowMs: 60_000 },
        },
        headers: 'legacy',
      });
      expect(limiter.tiers).toEqual(['anon', 'free', 'pro', 'admin']);
      const run = async (tier: 'anon' | 'free' | 'pro' | 'admin', k: string, n: number) => {
        const answers = [];
        for (let i = 0; i < n; i++) answers.push(await limiter.check(k, { tier }));
        return answers;
      };
      expect((await run('anon', key(), 2)).map((a) => a.allowed)).toEqual([true, false]);
      const free = await run('free', key(), 4);
      expect(free.map((a) => a.allowed)).toEqual([true, true, true, false]);
      expect(free[0].tier).toBe('free');
      expect(free[0].headers['X-RateLimit-Limit']).toBe('3');
      const pro = await run('pro', key(), 6);
      expect(pro.map((a) => a.allowed)).toEqual([true, true, true, true, true, false]);
      expect(pro[5].limits.map((l) => l.name)).toEqual(['burst', 'daily']);
      expect((await run('admin', key(), 50)).every((a) => a.allowed)).toBe(true);

      // Tiers with one limit count under the key itself: an upgrade keeps what the key spent.
      const k = key();
      await run('anon', k, 1);
      expect((await run('free', k, 3)).map((a) => a.allowed)).toEqual([true, true, false]);
      await expect(limiter.check(k, { tier: 'gold' as 'pro' })).rejects.toThrow(/tier must be one of/);
    });

    // The stores are made in the tests, after the suites' servers have started.
    const ratestoreOnly = (title: string, test: (store: RatestoreStore) => Promise<void>) => {
      if (hitOnly) return;
      it(title, async () => {
        const store = create();
        if (!isRatestore(store)) throw new Error(`${name} offers no ratestore operations`);
        await test(store);
      });
    };

    ratestoreOnly(
      'a refused request opens no window where its limits are one step (store[TAKES]), else one at 0',
      async (store) => {
        const limiter = createLimiter({
          store,
          limits: [
            { name: 'f', limit: 5, windowMs: 60_000 },
            { name: 's', algorithm: 'sliding-window', limit: 0, windowMs: 60_000 },
          ],
        });
        const k = key();
        expect((await limiter.check(k)).allowed).toBe(false);
        const open = await store.refund(`${k}:f`, 0);
        // One step: a store with store[TAKES], but a Redis Cluster (these keys have no {hash tag}).
        if (takesOneStep(store) && !/cluster/i.test(name)) {
          expect(open).toBeNull();
          return;
        }
        expect(open).not.toBeNull();
        expect(open!.count).toBe(0);
        expect(open!.resetMs).toBeGreaterThan(59_000);
      },
    );

    ratestoreOnly('holds at most limit leases of a concurrency limit; a release lets the next in', async (store) => {
      const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 3, leaseMs: 60_000 });
      const k = key();
      const answers = await Promise.all(Array.from({ length: 8 }, () => limiter.check(k)));
      const holders = answers.filter((a) => a.allowed);
      expect(holders).toHaveLength(3);
      await holders[0].release!();
      const next = await Promise.all([limiter.check(k), limiter.check(k)]);
      expect(next.filter((a) => a.allowed)).toHaveLength(1);
      for (const a of [...holders, ...next]) await a.release!();
      expect((await limiter.check(k)).allowed).toBe(true);
    });

    ratestoreOnly('ends a lease never given back after leaseMs; a late release frees no other lease', async (store) => {
      const limiter = createLimiter({ store, algorithm: 'concurrency', limit: 1, leaseMs: 300 });
      const k = key();
      const crashed = await limiter.check(k);
      expect(crashed.allowed).toBe(true);
      expect((await limiter.check(k)).allowed).toBe(false);
      await new Promise((resolve) => setTimeout(resolve, 400));
      const next = await limiter.check(k);
      expect(next.allowed).toBe(true);
      // The crashed request's release comes late: the lease it names has ended, the new one stays held.
      await crashed.release!();
      expect((await limiter.check(k)).allowed).toBe(false);
      await next.release!();
      expect((await limiter.check(k)).allowed).toBe(true);
    });

    ratestoreOnly(
      'lets exactly 25 of 100 parallel checks through a sliding window and a token bucket',
      async (store) => {
        const sliding = createLimiter({ store, algorithm: 'sliding-window', limit: 25, windowMs: 60_000 });
        const bucket = createLimiter({ store, algorithm: 'token-bucket', capacity: 25, refill: 1, intervalMs: 60_000 });
        for (const limiter of [sliding, bucket]) {
          const k = key();
          const answers = await Promise.all(Array.from({ length: 100 }, () => limiter.check(k)));
          expect(answers.filter((a) => a.allowed)).toHaveLength(25);
        }
      },
    );

    ratestoreOnly('limits with a sliding window', async (store) => {
      const limiter = createLimiter({ store, algorithm: 'sliding-window', limit: 2, windowMs: 60_000 });
      const k = key();
      const answers = [];
      for (let i = 0; i < 3; i++) answers.push(await limiter.check(k));
      expect(answers.map((a) => a.allowed)).toEqual([true, true, false]);
      expect(answers[0].limits[0].algorithm).toBe('sliding-window');
      expect(answers[2].retryAfter).toBeGreaterThanOrEqual(1);
      expect((await store.slidingWindow.increment(k, 60_000, 0)).count).toBe(2);
    });

    ratestoreOnly('limits with a token bucket, which refills', async (store) => {
      const limiter = createLimiter({
        store,
        algorithm: 'token-bucket',
        capacity: 2,
        refill: 1,
        intervalMs: 400,
        headers: 'draft-7',
      });
      const k = key();
      const answers = [];
      for (let i = 0; i < 3; i++) answers.push(await limiter.check(k));
      expect(answers.map((a) => [a.allowed, a.remaining])).toEqual([
        [true, 1],
        [true, 0],
        [false, 0],
      ]);
      expect(answers[2].retryAfter).toBe(1);
      expect(answers[0].headers['RateLimit-Policy']).toBe('2;w=1');
      await sleep(450);
      expect((await limiter.check(k)).allowed).toBe(true);
    });

    ratestoreOnly(
      'takes no tokens for a request a window refused, and gives the window back what a bucket refused',
      async (store) => {
        const bucket = {
          algorithm: 'token-bucket',
          name: 'bucket',
          capacity: 2,
          refill: 1,
          intervalMs: 60_000,
        } as const;
        const limiter = createLimiter({
          store,
          limits: [bucket, { name: 'window', algorithm: 'sliding-window', limit: 1, windowMs: 60_000 }],
        });
        const k = key();
        expect((await limiter.check(k)).allowed).toBe(true);
        const refused = await limiter.check(k);
        expect(refused.allowed).toBe(false);
        expect(refused.limits.map((l) => [l.name, l.allowed])).toEqual([
          ['bucket', true],
          ['window', false],
        ]);
        const tokens = (cost: number) => store.tokenBucket(`${k}:bucket`, { ...bucket, cost });
        expect((await tokens(0)).remaining).toBe(1);

        // The bucket refuses after the window allowed: the window's cost is given back.
        const wide = createLimiter({
          store,
          limits: [
            { name: 'window', limit: 10, windowMs: 60_000 },
            { ...bucket, capacity: 1 },
          ],
        });
        const w = key();
        expect((await wide.check(w)).allowed).toBe(true);
        expect((await wide.check(w)).allowed).toBe(false);
        expect(await count(store, `${w}:window`, 60_000)).toBe(1);
      },
    );
    if (hitOnly)
      it('refuses the algorithms that need ratestore’s stores at creation on a store with only hit', () => {
        const store = create();
        expect(isRatestore(store)).toBe(false);
        expect(() => createLimiter({ store, algorithm: 'sliding-window', limit: 1, windowMs: 1000 })).toThrow(
          /needs one of ratestore's stores/,
        );
        expect(() =>
          createLimiter({ store, algorithm: 'token-bucket', capacity: 1, refill: 1, intervalMs: 1 }),
        ).toThrow(TypeError);
      });
  });
}
