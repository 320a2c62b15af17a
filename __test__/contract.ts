// The RateLimitStore contract: every store runs these cases unchanged.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { RateLimitStore } from '../index.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export function rateLimitStoreContract(name: string, create: () => RateLimitStore): void {
  describe(`${name} (RateLimitStore contract)`, () => {
    // A fresh prefix per run, so counters from earlier runs don't interfere.
    const run = randomUUID();
    const key = (id: string): string => `contract:${run}:${id}`;

    it('adds amounts within a window', async () => {
      const store = create();
      expect((await store.hit(key('a'), 60_000, 1)).count).toBe(1);
      expect((await store.hit(key('a'), 60_000, 5)).count).toBe(6);
    });

    it('reads without changing when the amount is 0', async () => {
      const store = create();
      await store.hit(key('b'), 60_000, 2);
      expect((await store.hit(key('b'), 60_000, 0)).count).toBe(2);
      expect((await store.hit(key('b'), 60_000, 0)).count).toBe(2);
    });

    it('keeps keys independent', async () => {
      const store = create();
      await store.hit(key('c'), 60_000, 3);
      expect((await store.hit(key('d'), 60_000, 1)).count).toBe(1);
    });

    it('reports the time left in the window', async () => {
      const store = create();
      const { resetMs } = await store.hit(key('e'), 60_000, 1);
      expect(resetMs).toBeGreaterThan(0);
      expect(resetMs).toBeLessThanOrEqual(60_000);
      expect(Number.isInteger(resetMs)).toBe(true);
    });

    it('refunds negative amounts', async () => {
      const store = create();
      await store.hit(key('f'), 60_000, 3);
      expect((await store.hit(key('f'), 60_000, -1)).count).toBe(2);
    });

    it('starts a new window once the old one has passed', async () => {
      const store = create();
      await store.hit(key('g'), 1_000, 3);
      await sleep(1_100);
      expect((await store.hit(key('g'), 1_000, 1)).count).toBe(1);
    });

    it('never loses a concurrent update', async () => {
      const store = create();
      const hits = await Promise.all(Array.from({ length: 50 }, () => store.hit(key('h'), 60_000, 1)));
      expect(hits.map((hit) => hit.count).sort((a, b) => a - b)).toEqual(
        Array.from({ length: 50 }, (_, index) => index + 1),
      );
    });

    it('reads 0 for a key with no window, and opens none', async () => {
      const store = create();
      expect(await store.hit(key('i'), 30_000, 0)).toEqual({ count: 0, resetMs: 30_000 });
      expect(await store.hit(key('i'), 10_000, 0)).toEqual({ count: 0, resetMs: 10_000 });
      expect(await store.hit(key('i'), 20_000, 4)).toEqual({ count: 4, resetMs: 20_000 });
    });

    it('keeps the end of an open window whatever windowMs a later hit passes', async () => {
      const store = create();
      await store.hit(key('j'), 2_000, 1);
      const later = await store.hit(key('j'), 600_000, 1);
      expect(later.count).toBe(2);
      expect(later.resetMs).toBeLessThanOrEqual(2_000);
    });

    it('starts a refund on a key with no window as a negative counter', async () => {
      const store = create();
      expect((await store.hit(key('k'), 60_000, -4)).count).toBe(-4);
      expect((await store.hit(key('k'), 60_000, 1)).count).toBe(-3);
    });

    it('accepts an empty key and a 64 KiB key', async () => {
      const store = create();
      const long = 'x'.repeat(64 * 1024) + run;
      expect((await store.hit(long, 60_000, 2)).count).toBe(2);
      expect((await store.hit(long + 'y', 60_000, 1)).count).toBe(1);
      expect((await store.hit(long, 60_000, 0)).count).toBe(2);
      const empty = await store.hit('', 1, 0);
      expect(empty.count).toBeGreaterThanOrEqual(0);
    });

    it('rejects bad arguments with a promise, not a throw', async () => {
      const store = create();
      const hit = store.hit as (...args: unknown[]) => Promise<unknown>;
      const pending = hit.call(store, 42, 60_000, 1);
      expect(pending).toBeInstanceOf(Promise);
      await expect(pending).rejects.toBeInstanceOf(TypeError);
      await expect(hit.call(store, key('l'), 0, 1)).rejects.toBeInstanceOf(RangeError);
      await expect(hit.call(store, key('l'), 60_000, 0.5)).rejects.toBeInstanceOf(RangeError);
      expect((await store.hit(key('l'), 60_000, 0)).count).toBe(0);
    });

    it('counts up to the edge of the safe-integer range and refuses past it', async () => {
      const store = create();
      const max = Number.MAX_SAFE_INTEGER;
      expect((await store.hit(key('m'), 60_000, max - 1)).count).toBe(max - 1);
      expect((await store.hit(key('m'), 60_000, 1)).count).toBe(max);
      await expect(store.hit(key('m'), 60_000, 1)).rejects.toBeInstanceOf(RangeError);
      expect((await store.hit(key('m'), 60_000, 0)).count).toBe(max);
      expect((await store.hit(key('m'), 60_000, -max)).count).toBe(0);
    });
  });
}

/**
 * Calls made in one turn on a store of UTF-8 text keys (postgresStore, mysqlStore): the keys between
 * two good ones hold lone surrogates (which together would make a pair); each fails alone with a
 * TypeError naming no key, and the good ones count in the order they were made. Closes the store.
 */
export async function loneSurrogatesMadeTogether(store: RateLimitStore & { close(): Promise<void> }): Promise<void> {
  const key = `turn:${randomUUID()}`;
  const settled = await Promise.allSettled([
    store.hit(key, 60_000, 1),
    store.hit(`${key}\ud800`, 60_000, 1),
    store.hit(`\udc00${key}`, 60_000, 1),
    store.hit(key, 60_000, 2),
  ]);
  const value = (i: number) => (settled[i] as PromiseFulfilledResult<{ count: number }>).value;
  expect(value(0).count).toBe(1);
  expect(value(3).count).toBe(3);
  for (const i of [1, 2]) {
    const reason = (settled[i] as PromiseRejectedResult).reason;
    expect(reason).toBeInstanceOf(TypeError);
    expect(reason.message).toMatch(/lone surrogate/);
    expect(reason.message).not.toContain(key);
  }
  expect((await store.hit(key, 60_000, 0)).count).toBe(3);
  await store.close();
}
