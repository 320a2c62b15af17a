// createLimiter's fallback store against a real redis-server that is killed, paused (SIGSTOP) and
// restarted under load: while the main store fails the fallback counts, no check waits past the
// store's timeoutMs, and no request is counted twice.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, type LimitResult, type MemoryStore, type RedisStore } from '../index.js';
import { perCase, type RedisServer } from './support/redis.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const KEY_MARKER = '198.51.100.77-key-marker';

const { server, store } = perCase('fallback');

interface Seen {
  key: string;
  started: number;
  ms: number;
  allowed?: boolean;
  fallback?: boolean;
  cached?: boolean;
  code?: string;
  sent?: boolean;
}

/** `workers` loops of checks over `keys` until `stop()`; every check's outcome and time is kept. */
function load(limiter: ReturnType<typeof createLimiter>, keys: string[], workers: number) {
  const seen: Seen[] = [];
  let stopped = false;
  const loop = async (id: number) => {
    for (let i = id; !stopped; i += workers) {
      const key = keys[i % keys.length];
      const started = performance.now();
      const entry: Seen = { key, started, ms: 0 };
      try {
        const answer = await limiter.check(key);
        Object.assign(entry, { allowed: answer.allowed, fallback: answer.fallback, cached: answer.cached });
      } catch (error) {
        const e = error as { code: string; sent?: boolean; message: string };
        expect(e.message).not.toContain(KEY_MARKER);
        Object.assign(entry, { code: e.code, sent: e.sent });
      }
      entry.ms = performance.now() - started;
      seen.push(entry);
      await sleep(2);
    }
  };
  const running = Promise.all(Array.from({ length: workers }, (_, id) => loop(id)));
  return {
    seen,
    async stop() {
      stopped = true;
      await running;
    },
    /** Resolves once the limiter has gone back to the main store. */
    async backOnMain(ms: number) {
      const deadline = performance.now() + ms;
      while (performance.now() < deadline) {
        if (!limiter.stats().fallbackActive) return;
        await sleep(20);
      }
      throw new Error('the limiter did not go back to the main store');
    },
  };
}

/** A fixed window's count in a store, read without changing it. */
async function countIn(s: MemoryStore | RedisStore, key: string): Promise<number> {
  return (await s.consume(key, { limit: 1_000_000, windowMs: 60_000, cost: 0 })).count;
}

function byKey(seen: Seen[], keys: string[], pick: (s: Seen) => boolean): Map<string, number> {
  return new Map(keys.map((k) => [k, seen.filter((s) => s.key === k && pick(s)).length]));
}

const LIMIT = 40;
const SCALE = 0.5;
const TIMEOUT_MS = 600;

function setUp(redis: RedisServer, blockCache = true) {
  const main = store(redis.url, { timeoutMs: TIMEOUT_MS });
  const fallback = memoryStore();
  const told: { code: string; fallback: boolean }[] = [];
  const limiter = createLimiter({
    store: main,
    fallback: { store: fallback, scale: SCALE, probeMs: 50 },
    limit: LIMIT,
    windowMs: 60_000,
    blockCache,
    onError: (error, info) => told.push({ code: (error as { code: string }).code, fallback: info.fallback }),
  });
  const keys = Array.from({ length: 4 }, (_, i) => `${KEY_MARKER}:${i}:${randomUUID()}`);
  return { main, fallback, told, limiter, keys };
}

describe('createLimiter with a fallback store', () => {
  it('counts in the fallback while redis-server is killed, and in Redis again once it is back', async () => {
    const redis = await server();
    // Without the block cache every check asks a store, so that Redis counts again after the restart.
    const { main, fallback, told, limiter, keys } = setUp(redis, false);
    const run = load(limiter, keys, 8);
    await sleep(300);
    const killedAt = performance.now();
    redis.signal('SIGKILL');
    await sleep(800);
    await redis.restart();
    const restartedAt = performance.now();
    await run.backOnMain(8_000);
    await sleep(300);
    await run.stop();
    const { seen } = run;

    // No check waited for a timeout: a refused connect fails at once, and then the circuit is open.
    expect(Math.max(...seen.map((s) => s.ms))).toBeLessThan(TIMEOUT_MS);
    const duringOutage = seen.filter((s) => s.started > killedAt + 50 && s.started < restartedAt);
    expect(duringOutage.length).toBeGreaterThan(100);
    expect(duringOutage.every((s) => s.fallback === true)).toBe(true);
    // Only checks in flight at the kill may reject (their call had been sent: it may have counted).
    const rejected = seen.filter((s) => s.code !== undefined);
    expect(rejected.length).toBeLessThanOrEqual(8);
    for (const r of rejected) expect(r).toMatchObject({ sent: true });
    expect(told.some((t) => t.fallback)).toBe(true);

    // The fallback counted exactly the requests it allowed, within its own (scaled) limit.
    const fellBack = byKey(seen, keys, (s) => s.fallback === true && s.allowed === true);
    for (const k of keys) {
      expect(await countIn(fallback, k)).toBe(fellBack.get(k));
      expect(fellBack.get(k)).toBeLessThanOrEqual(LIMIT * SCALE);
    }
    // The restarted server lost its data: it holds what was counted after the kill, within the limit.
    const counted = byKey(seen, keys, (s) => s.started > killedAt && s.allowed === true && !s.fallback);
    for (const k of keys) {
      expect(await countIn(main, k)).toBe(counted.get(k));
      expect(counted.get(k)).toBeLessThanOrEqual(LIMIT);
    }
    expect(seen.some((s) => s.started > restartedAt && s.allowed === true && !s.fallback)).toBe(true);
    expect(limiter.stats()).toMatchObject({ fallbackActive: false });
    expect(limiter.stats().fallbackChecks).toBe(seen.filter((s) => s.fallback).length);
  });

  it('counts in the fallback while redis-server is paused: one wave of checks waits for timeoutMs, then none', async () => {
    const redis = await server();
    const { main, fallback, limiter, keys } = setUp(redis, false);
    const run = load(limiter, keys, 8);
    await sleep(300);
    const pausedAt = performance.now();
    redis.signal('SIGSTOP');
    await sleep(TIMEOUT_MS + 1_200);
    redis.signal('SIGCONT');
    const resumedAt = performance.now();
    await run.backOnMain(8_000);
    await sleep(300);
    await run.stop();
    const { seen } = run;

    expect(Math.max(...seen.map((s) => s.ms))).toBeLessThan(TIMEOUT_MS + 300);
    // The checks in flight when the server stopped answering wait for the timeout and reject; once
    // that failure is known, checks go straight to the fallback.
    const slow = seen.filter((s) => s.ms > TIMEOUT_MS / 2);
    expect(slow.length).toBeGreaterThan(0);
    expect(slow.length).toBeLessThanOrEqual(8);
    for (const s of slow) expect(s.started).toBeLessThan(pausedAt + TIMEOUT_MS);
    const rejected = seen.filter((s) => s.code !== undefined);
    // Sent, so never counted in the fallback: a timeout, or the loss of the stuck connection that the
    // first timeout replaces (the hits still on it reject with ERR_CONNECTION, sent).
    for (const r of rejected) {
      expect(r.sent).toBe(true);
      expect(['ERR_TIMEOUT', 'ERR_CONNECTION']).toContain(r.code);
    }
    const late = seen.filter((s) => s.started > pausedAt + TIMEOUT_MS + 100 && s.started < resumedAt);
    expect(late.length).toBeGreaterThan(100);
    expect(late.every((s) => (s.fallback === true || s.cached === true) && s.ms < TIMEOUT_MS / 2)).toBe(true);

    const fellBack = byKey(seen, keys, (s) => s.fallback === true && s.allowed === true);
    const counted = byKey(seen, keys, (s) => s.allowed === true && !s.fallback);
    const timedOut = byKey(seen, keys, (s) => s.code !== undefined);
    for (const k of keys) {
      expect(await countIn(fallback, k)).toBe(fellBack.get(k));
      expect(fellBack.get(k)).toBeLessThanOrEqual(LIMIT * SCALE);
      // Redis kept its data: what it allowed, and perhaps the timed-out calls it ran once resumed.
      const inRedis = await countIn(main, k);
      expect(inRedis).toBeGreaterThanOrEqual(counted.get(k)!);
      expect(inRedis).toBeLessThanOrEqual(counted.get(k)! + timedOut.get(k)!);
      expect(counted.get(k)).toBeLessThanOrEqual(LIMIT);
      // Throughout: at most the limit in Redis and the fallback's own limit beside it.
      expect(counted.get(k)! + fellBack.get(k)!).toBeLessThanOrEqual(LIMIT + LIMIT * SCALE);
    }
  });

  it('never counts in the fallback a check whose call had reached Redis: it rejects, and Redis may count it', async () => {
    const redis = await server();
    const { main, fallback, limiter } = setUp(redis);
    const k = `${KEY_MARKER}:${randomUUID()}`;
    expect((await limiter.check(k)).allowed).toBe(true);
    redis.signal('SIGSTOP');
    const started = performance.now();
    const error = await limiter.check(k).then(
      () => undefined,
      (e: unknown) => e as { code: string; sent: boolean },
    );
    expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 300);
    expect(error).toMatchObject({ code: 'ERR_TIMEOUT', sent: true });
    // The next check goes to the fallback at once.
    expect(await limiter.check(k)).toMatchObject({ allowed: true, fallback: true });
    redis.signal('SIGCONT');
    // The paused server ran the timed-out call once resumed: counted there, and only there.
    await sleep(100);
    const deadline = performance.now() + 5_000;
    while (limiter.stats().fallbackActive && performance.now() < deadline) await sleep(20);
    expect(await countIn(main, k)).toBe(2);
    expect(await countIn(fallback, k)).toBe(1);
  });

  it('goes straight to the fallback once a failure is known, probing the main store once at a time', async () => {
    const redis = await server();
    const { main, told, limiter } = setUp(redis);
    const k = `${KEY_MARKER}:${randomUUID()}`;
    expect((await limiter.check(k)).fallback).toBeUndefined();
    redis.signal('SIGKILL');
    await sleep(100);
    const first = await limiter.check(k).catch((error: unknown) => error);
    const callsBefore = main.stats().calls;
    const started = performance.now();
    const answers = await Promise.all(Array.from({ length: 300 }, () => limiter.check(k)));
    for (let i = 0; i < 20; i++) {
      answers.push(await limiter.check(k));
      await sleep(10);
    }
    const elapsed = performance.now() - started;
    expect(answers.every((a) => a.fallback === true)).toBe(true);
    // One probe at a time, at most one per probeMs (50): not one call per check.
    expect(main.stats().calls - callsBefore).toBeLessThanOrEqual(2 + Math.ceil(elapsed / 50));
    const answer = answers[0];
    expect(answer).toMatchObject({ allowed: true, limit: LIMIT * SCALE, fallback: true });
    expect((answer.error as { code: string }).code).toMatch(/^ERR_(CONNECTION|TIMEOUT)$/);
    expect(answers.filter((a) => a.allowed)).toHaveLength(LIMIT * SCALE - (first instanceof Error ? 0 : 1));
    expect(told.length).toBeGreaterThan(0);
    expect(told.every((t) => t.fallback)).toBe(true);
    expect(limiter.stats().fallbackActive).toBe(true);
    await redis.restart();
    const deadline = performance.now() + 8_000;
    let back: LimitResult<never> | undefined;
    while (performance.now() < deadline) {
      back = await limiter.check(`${k}:after`);
      if (!back.fallback) break;
      await sleep(20);
    }
    expect(back).toMatchObject({ allowed: true, limit: LIMIT });
    expect(back!.fallback).toBeUndefined();
    expect(limiter.stats().fallbackActive).toBe(false);
  });

  it('tells onError of a failing store, with or without a fallback, and never of a working one', async () => {
    const told: boolean[] = [];
    const closed = memoryStore();
    await closed.close();
    const alone = createLimiter({
      store: closed,
      limit: 5,
      windowMs: 60_000,
      onError: (_e, i) => told.push(i.fallback),
    });
    await expect(alone.check('k')).rejects.toMatchObject({ code: 'ERR_CLOSED' });
    expect(told).toEqual([false]);
    // ERR_CLOSED was never sent: the fallback counts the check.
    const backup = memoryStore();
    const withFallback = createLimiter({
      store: closed,
      fallback: backup,
      limit: 5,
      windowMs: 60_000,
      onError: (_e, i) => told.push(i.fallback),
    });
    expect(await withFallback.check('k')).toMatchObject({ allowed: true, fallback: true, remaining: 4 });
    expect(told).toEqual([false, true]);
    expect(await countIn(backup, 'k')).toBe(1);
    const working = createLimiter({ store: memoryStore(), limit: 1, windowMs: 60_000, onError: () => told.push(true) });
    await working.check('k');
    await working.check('k');
    expect(told).toHaveLength(2);
  });

  it('refuses bad options with a TypeError or RangeError', () => {
    const main = memoryStore();
    const base = { store: main, limit: 10, windowMs: 1_000 };
    expect(() => createLimiter({ ...base, fallback: 'memory' as never })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, fallback: { store: {} } as never })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, fallback: { store: main, scale: 0 } })).toThrow(RangeError);
    expect(() => createLimiter({ ...base, fallback: { store: main, scale: 2 } })).toThrow(RangeError);
    expect(() => createLimiter({ ...base, fallback: { store: main, scale: '1' as never } })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, fallback: { store: main, probeMs: 0 } })).toThrow(RangeError);
    expect(() => createLimiter({ ...base, fallback: { store: main, other: 1 } as never })).toThrow(TypeError);
    expect(() => createLimiter({ ...base, onError: 'log' as never })).toThrow(TypeError);
    const hitOnly = { shared: false, hit: main.hit.bind(main) };
    expect(() =>
      createLimiter({ store: main, algorithm: 'sliding-window', limit: 1, windowMs: 1_000, fallback: hitOnly }),
    ).toThrow(TypeError);
    expect(() =>
      createLimiter({ ...base, fallback: { store: memoryStore(), scale: 0.25, probeMs: 100 } }),
    ).not.toThrow();
  });
});
