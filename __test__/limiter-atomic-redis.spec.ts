// Several limits as one step on redisStore: one script over every limit's key, which puts every key back
// as it found it when one limit refuses, on both transports (Node's event loop and the I/O thread), and
// in a Redis Cluster for a key whose `{hash tag}` puts every limit's key in one slot.
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, redisStore, type RedisStore } from '../index.js';
import { startRedis, scriptsRun, type RedisServer } from './support/redis.js';
import { startCluster, type Cluster } from './support/cluster.js';

const requireCjs = createRequire(__filename);
const { runtime } = requireCjs('../lib/runtime.js') as { runtime: { eventLoop: boolean } };
const { TAKES, OP } = requireCjs('../lib/ops.js') as {
  TAKES: symbol;
  OP: Record<string, number>;
};

const DAY = 86_400_000;
let server: RedisServer;
const stores: RedisStore[] = [];

function storeOn(eventLoop: boolean, url = server.url, options: Parameters<typeof redisStore>[0] = {}): RedisStore {
  const before = runtime.eventLoop;
  runtime.eventLoop = eventLoop;
  try {
    const store = redisStore({ url, prefix: 'atomic:', ...options });
    stores.push(store);
    return store;
  } finally {
    runtime.eventLoop = before;
  }
}

beforeAll(async () => {
  server = await startRedis();
});

afterAll(async () => {
  await Promise.all(stores.map((store) => store.close()));
  await server?.stop();
});

/** What a key holds, as other clients see it. */
async function seen(key: string): Promise<string[]> {
  const type = await server.cli('TYPE', key);
  const value =
    type === 'string' ? await server.cli('GET', key) : type === 'hash' ? await server.cli('HGETALL', key) : '';
  return [type, value, await server.cli('PEXPIRETIME', key)];
}

for (const eventLoop of [true, false]) {
  describe(`several limits as one step on redisStore (${eventLoop ? 'event loop' : 'I/O thread'})`, () => {
    it('burst 7 and daily 20, and a limiter of the daily limit alone at once: daily lets exactly 20 through', async () => {
      const store = storeOn(eventLoop);
      const both = createLimiter({
        store,
        limits: [
          { name: 'burst', limit: 7, windowMs: 600_000 },
          { name: 'daily', limit: 20, windowMs: DAY },
        ],
      });
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
      expect(await server.cli('GET', `atomic:${k}:daily`)).toBe('20');
      expect(await server.cli('GET', `atomic:${k}:burst`)).toBe('7');
    });

    it('a refused step is one script and leaves every key as it was: window, sliding window and bucket', async () => {
      const store = storeOn(eventLoop);
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'sliding', algorithm: 'sliding-window', limit: 10, windowMs: 60_000 },
          { name: 'bucket', algorithm: 'token-bucket', capacity: 5, refill: 1, intervalMs: 60_000 },
          { name: 'burst', limit: 1, windowMs: 60_000 },
        ],
      });
      const k = randomUUID();
      expect((await limiter.check(k)).allowed).toBe(true);
      const keys = [`atomic:${k}:sliding:sw`, `atomic:${k}:bucket:tb`, `atomic:${k}:burst`];
      const before = await Promise.all(keys.map(seen));
      expect(before.map(([type]) => type)).toEqual(['hash', 'hash', 'string']);
      const scripts = await scriptsRun(server);
      const refused = await limiter.check(k);
      expect(await scriptsRun(server)).toBe(scripts + 1);
      expect(refused.allowed).toBe(false);
      expect(refused.limits.map((l) => [l.name, l.allowed, l.remaining])).toEqual([
        ['sliding', true, 9],
        ['bucket', true, 5],
        ['burst', false, 0],
      ]);
      expect(await Promise.all(keys.map(seen))).toEqual(before);
    });

    it('a refused step on keys that do not exist yet leaves none behind', async () => {
      const store = storeOn(eventLoop);
      const limiter = createLimiter({
        store,
        limits: [
          { name: 'sliding', algorithm: 'sliding-window', limit: 10, windowMs: 60_000 },
          { name: 'bucket', algorithm: 'token-bucket', capacity: 5, refill: 1, intervalMs: 60_000 },
          { name: 'none', limit: 0, windowMs: 60_000 },
        ],
      });
      const k = randomUUID();
      expect((await limiter.check(k)).allowed).toBe(false);
      expect(await server.cli('KEYS', `atomic:${k}*`)).toBe('');
    });

    it('a step whose key holds other data rejects as the single op does, and changes nothing', async () => {
      const store = storeOn(eventLoop);
      const k = randomUUID();
      await server.cli('SET', `atomic:${k}:b`, 'not a counter');
      const single = await store.consume(`${k}:b`, { limit: 5, windowMs: 60_000 }).catch((e: unknown) => e);
      const takes = [
        { op: OP.consume, key: `${k}:a`, a: 60_000, b: 5, c: 1, d: 0 },
        { op: OP.consume, key: `${k}:b`, a: 60_000, b: 5, c: 1, d: 0 },
      ];
      const step = await (store as unknown as Record<symbol, (t: unknown) => Promise<unknown>>)
        [TAKES](takes)
        .catch((e: unknown) => e);
      expect(step).toBeInstanceOf(Error);
      expect((step as { code: string }).code).toBe((single as { code: string }).code);
      expect(await server.cli('EXISTS', `atomic:${k}:a`)).toBe('0');
      expect(await server.cli('GET', `atomic:${k}:b`)).toBe('not a counter');
    });

    it('answers each take as its own op would', async () => {
      const store = storeOn(eventLoop);
      const k = randomUUID();
      const takes = [
        { op: OP.consume, key: `${k}:a`, a: 60_000, b: 5, c: 2, d: 0 },
        { op: OP.slidingConsume, key: `${k}:s`, a: 60_000, b: 5, c: 1, d: 0 },
        { op: OP.tokenBucket, key: `${k}:t`, a: 3, b: 1, c: 60_000, d: 1 },
      ];
      const step = (await (store as unknown as Record<symbol, (t: unknown) => Promise<unknown>>)[TAKES](takes)) as {
        allowed: boolean;
        answers: Record<string, unknown>[];
      };
      expect(step.allowed).toBe(true);
      expect(step.answers[0]).toMatchObject({ allowed: true, count: 2, remaining: 3, retryMs: 0 });
      expect(step.answers[1]).toMatchObject({ allowed: true, count: 1, remaining: 4, retryMs: 0 });
      expect(step.answers[2]).toMatchObject({ allowed: true, remaining: 2, retryMs: 0 });
      expect((await store.consume(`${k}:a`, { limit: 5, windowMs: 60_000, cost: 0 })).count).toBe(2);
    });
  });
}

describe('several limits as one step in a Redis Cluster', () => {
  let cluster: Cluster;
  beforeAll(async () => {
    cluster = await startCluster();
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });

  it('a key with a {hash tag} goes as one step; a key without one is taken limit by limit', async () => {
    const store = redisStore({ url: cluster.url, cluster: true, prefix: 'atomic:', timeoutMs: 5_000 });
    stores.push(store);
    const both = createLimiter({
      store,
      limits: [
        { name: 'burst', limit: 7, windowMs: 600_000 },
        { name: 'daily', limit: 20, windowMs: DAY },
      ],
    });
    const daily = createLimiter({ store, limit: 20, windowMs: DAY });
    const k = `{user:${randomUUID()}}`;
    const checks = [];
    for (let i = 0; i < 40; i++) {
      checks.push(both.check(k).then((a) => ['both', a.allowed] as const));
      checks.push(daily.check(`${k}:daily`).then((a) => ['daily', a.allowed] as const));
    }
    const answers = await Promise.all(checks);
    const allowed = (who: string) => answers.filter(([w, ok]) => w === who && ok).length;
    expect(allowed('both')).toBe(7);
    expect(allowed('both') + allowed('daily')).toBe(20);
    const step = (store as unknown as Record<symbol, (t: unknown) => Promise<unknown>>)[TAKES];
    const untagged = randomUUID();
    const takes = ['a', 'b', 'c', 'd'].map((s) => ({
      op: OP.consume,
      key: `${untagged}:${s}`,
      a: 60_000,
      b: 5,
      c: 1,
      d: 0,
    }));
    expect(await step.call(store, takes)).toBeNull();
    const loose = await createLimiter({
      store,
      limits: [
        { name: 'a', limit: 1, windowMs: 60_000 },
        { name: 'b', limit: 1, windowMs: 60_000 },
      ],
    }).check(untagged);
    expect(loose.allowed).toBe(true);
  });

  it('hashTag: true derives the tag from the key: burst 7 and daily 20 on a plain key are one step', async () => {
    const store = redisStore({ url: cluster.url, cluster: true, prefix: 'atomic:', timeoutMs: 5_000 });
    stores.push(store);
    const limits = [
      { name: 'burst', limit: 7, windowMs: 600_000 },
      { name: 'daily', limit: 20, windowMs: DAY },
    ];
    const both = createLimiter({ store, hashTag: true, limits });
    // A second limiter on the daily counter alone: its key is the one hashTag gives the daily limit.
    const daily = createLimiter({ store, limit: 20, windowMs: DAY });
    const k = `user:${randomUUID()}`;
    const checks = [];
    for (let i = 0; i < 40; i++) {
      checks.push(both.check(k).then((a) => ['both', a.allowed] as const));
      checks.push(daily.check(`{${k}}:daily`).then((a) => ['daily', a.allowed] as const));
    }
    const answers = await Promise.all(checks);
    const allowed = (who: string) => answers.filter(([w, ok]) => w === who && ok).length;
    expect(allowed('both')).toBe(7);
    expect(allowed('both') + allowed('daily')).toBe(20);
    // The counters are where hashTag puts them, in one slot: the plain layout holds nothing.
    expect((await store.hit(`{${k}}:burst`, 600_000, 0)).count).toBe(7);
    expect((await store.hit(`${k}:burst`, 600_000, 0)).count).toBe(0);
    // reset(key) clears the tagged layout.
    await both.reset(k);
    expect((await store.hit(`{${k}}:burst`, 600_000, 0)).count).toBe(0);
    expect((await both.check(k)).allowed).toBe(true);
  });
});
