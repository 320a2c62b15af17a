// The native layer as a hostile or careless caller meets it: arrays it can
// detach, strings no UTF-8 holds, Node-API calls that fail mid-delivery, and
// Redis data that is not a counter.
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { memoryStore, redisStore, type RateLimitStore } from '../index.js';
import { plainRedis, runFixture } from './support/redis.js';

const fixture = join(__dirname, 'fixtures', 'native-safety.js');

let server: Awaited<ReturnType<typeof plainRedis>>;
beforeAll(async () => {
  server = await plainRedis();
});
afterAll(() => server?.stop());

const prefix = `native:${randomUUID()}:`;
const redis = () => redisStore({ url: server.url, prefix, timeoutMs: 5_000 });

describe('memory JavaScript can reach', () => {
  it(
    'a detached or transferred io array never feeds a hit, and the addon exports no array',
    { timeout: 60_000 },
    async () => {
      const seen = JSON.parse(await runFixture(fixture, ['memory'], ['--expose-gc']));
      expect(seen.first).toEqual([2, 60_000]);
      expect(seen.failed).toEqual(['ERR_OUT_OF_RANGE', true, true]);
      // Node.js 20 accepts a transfer of the addon's buffers and copies them; 21 and later refuse it
      // (DataCloneError), but ArrayBuffer.prototype.transfer() (Node.js 22 on) does detach them.
      // Whatever the engine did, a hit reads only numbers written for it: a detached array fails
      // the hit, an intact one counts on.
      expect(['accepted', 'DataCloneError']).toContain(seen.cloneTransfer);
      expect(['accepted', 'TypeError', 'none']).toContain(seen.bufferTransfer);
      const detached = seen.detachedLength === 0;
      // Some way of detaching works on every Node.js tested here but 20, so this case is not idle.
      if (seen.bufferTransfer === 'accepted') expect(detached).toBe(true);
      if (detached) expect(seen.afterDetach.code).toBe('ERR_INTERNAL');
      else expect(seen.afterDetach).toEqual({ answer: 7 });
      expect(['accepted', 'DataCloneError']).toContain(seen.postTransfer);
      if (seen.transferredLength === 0) {
        expect(seen.afterTransfer.code).toBe('ERR_INTERNAL');
        expect(seen.afterTransfer.message).toMatch(/numbers did not reach the store/);
      } else {
        expect(seen.afterTransfer).toEqual({ answer: 3 });
      }
      expect(seen.size).toBe(1);
      expect(seen.exports).toEqual([]);
      expect(seen.jsFaceSize).toBeGreaterThan(0);
    },
  );

  it(
    'every promise of a Redis delivery settles when settle throws part-way, and detached results are harmless',
    { timeout: 60_000 },
    async () => {
      const seen = JSON.parse(await runFixture(fixture, ['redis', server.url], ['--expose-gc']));
      expect(seen.settled + seen.errors).toBe(3_000);
      expect(seen.errors).toBe(0);
      expect(seen.detachedResults.calls).toBe(100);
      // Refused from Node.js 21 on: the results array then stays whole.
      expect(['accepted', 'DataCloneError']).toContain(seen.resultsTransfer);
      if (seen.resultsTransfer !== 'accepted') expect(seen.detachedResults.length).toBe(7 * 1024); // 1,024 results of an id and six numbers
      expect(seen.worker).toBe(100);
    },
  );
});

describe('keys are opaque: no two strings share a counter', () => {
  // Lone surrogates, and the replacement character a lossy conversion would make of them.
  const keys = ['user:\ud800', 'user:\udbff', 'user:\udc00', 'user:\ufffd', 'user:\ud800\udc00', 'user:\udc00\ud800'];

  const distinct = (name: string, make: () => RateLimitStore) =>
    it(`${name} keeps every key apart`, async () => {
      const store = make();
      const tag = randomUUID();
      for (const [i, key] of keys.entries()) expect((await store.hit(tag + key, 60_000, i + 1)).count).toBe(i + 1);
      for (const [i, key] of keys.entries()) expect((await store.hit(tag + key, 60_000, 0)).count).toBe(i + 1);
    });
  distinct('memoryStore', () => memoryStore());
  distinct('redisStore', redis);

  it('redisStore stores a well-formed key as its UTF-8 bytes and a lone surrogate as WTF-8', async () => {
    const key = `wtf8:${randomUUID()}:`;
    await redis().hit(`${key}é`, 60_000, 1);
    await redis().hit(`${key}\ud800`, 60_000, 2);
    expect(await server.cli('GET', `${prefix}${key}é`)).toBe('1');
    // redis-cli prints the bytes it cannot show as \x escapes.
    const listed = await server.cli('--no-raw', 'KEYS', `${prefix}${key}*`);
    expect(listed).toContain('\\xed\\xa0\\x80');
  });

  it('store names and prefixes must be well-formed: two would otherwise be one', () => {
    expect(() => memoryStore({ name: 'store\ud800' })).toThrow(TypeError);
    expect(() => memoryStore({ name: 'store\ud800' })).toThrow(/well-formed/);
    expect(() => redisStore({ prefix: 'app\udbff:' })).toThrow(TypeError);
    // A name made of whole characters is fine, and names one table.
    const a = memoryStore({ name: `named-\u{1f980}-${process.pid}` });
    const b = memoryStore({ name: `named-\u{1f980}-${process.pid}` });
    return a.hit('k', 60_000, 1).then(() => expect(b.hit('k', 60_000, 0)).resolves.toMatchObject({ count: 1 }));
  });
});

describe('redisStore never answers 0 for data that is not its counter', () => {
  for (const [what, write] of [
    ['a string that is no integer, without a TTL', (key: string) => server.cli('SET', key, 'abc')],
    ['a list', (key: string) => server.cli('RPUSH', key, 'a')],
    ['a decimal string with a TTL', (key: string) => server.cli('SET', key, '1.5', 'PX', '60000')],
  ] as const) {
    it(`rejects a read and a hit of ${what}, changing nothing`, async () => {
      const key = `other:${randomUUID()}`;
      await write(prefix + key);
      const before = await server.cli('DUMP', prefix + key);
      for (const amount of [0, 1]) {
        const error = await redis()
          .hit(key, 60_000, amount)
          .then(
            () => undefined,
            (e: unknown) => e,
          );
        expect(error, `amount ${amount}`).toBeInstanceOf(Error);
        expect((error as { code: string }).code).toBe('ERR_REDIS');
      }
      expect(await server.cli('DUMP', prefix + key)).toBe(before);
    });
  }
});

describe('op numbers', () => {
  it('are the native side’s, in one list: each op the JS face sends is the op the addon runs', async () => {
    const require = createRequire(__filename);
    const native = require('../lib/native.js') as { opNames(): string[] };
    const { OP } = require('../lib/ops.js') as { OP: Record<string, number> };
    const names = native.opNames();
    expect(names).toEqual([
      'hit',
      'consume',
      'refund',
      'slidingIncrement',
      'slidingDecrement',
      'slidingConsume',
      'tokenBucket',
      'unlink',
      'ping',
      'takes',
    ]);
    expect(OP).toEqual(Object.fromEntries(names.map((name, code) => [name, code])));
    expect(Object.isFrozen(OP)).toBe(true);
    // Each number reaches the op of its name: a refund is no consume, a sliding consume no increment.
    const store = memoryStore();
    const key = `ops:${randomUUID()}`;
    expect(await store.hit(key, 60_000, 5)).toMatchObject({ count: 5 });
    expect(await store.refund(key, 2)).toMatchObject({ count: 3 });
    expect(await store.consume(key, { limit: 4, windowMs: 60_000, cost: 2 })).toMatchObject({
      allowed: false,
      count: 3,
    });
    expect(await store.slidingWindow.increment(key, 60_000, 2)).toMatchObject({ count: 2 });
    expect(await store.slidingWindow.decrement(key, 60_000, 1)).toMatchObject({ count: 1 });
    expect(await store.slidingWindow.consume(key, { limit: 2, windowMs: 60_000 })).toMatchObject({
      allowed: true,
      count: 2,
    });
    expect(await store.tokenBucket(key, { capacity: 3, refill: 1, intervalMs: 60_000, cost: 2 })).toMatchObject({
      allowed: true,
      remaining: 1,
    });
    await store.reset(key);
    expect(await store.hit(key, 60_000, 0)).toMatchObject({ count: 0 });
    await store.close();
    // ping is a server store's: one PING through redisStore.
    const server = redis();
    await expect(server.ping()).resolves.toBeUndefined();
    await server.close();
  });
});
