import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore, type RedisStoreOptions } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite, redisOrderSuite } from './operations-suite.js';
import { plainRedis, rejection as rejectionOf, runFixture } from './support/redis.js';
import { hitFromWorkers } from './support/workers.js';

let server: Awaited<ReturnType<typeof plainRedis>>;
beforeAll(async () => {
  server = await plainRedis();
});
afterAll(() => server?.stop());

const prefix = `test:${randomUUID()}:`;
const make = (options: RedisStoreOptions = {}) => redisStore({ url: server.url, prefix, timeoutMs: 5_000, ...options });

rateLimitStoreContract('redisStore', () => make());
limiterSuite('redisStore', () => make());
operationsSuite('redisStore', () => make());
redisOrderSuite('redisStore', make, () => server.cli('SCRIPT', 'FLUSH'));

const KEY_MARKER = '203.0.113.77-key-marker';
const TOKEN_MARKER = 'token-marker-5f1c';
const PASSWORD_MARKER = 'password-marker-9d2e';

const rejection = (pending: Promise<unknown>) => rejectionOf(pending, [KEY_MARKER, TOKEN_MARKER, PASSWORD_MARKER]);

/** Runs `fn` with only the given Redis variables in process.env, restoring them after. */
async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const names = ['REDIS_URL', 'KV_URL', 'REDIS_TOKEN', 'REDIS_CLUSTER'];
  names.push('UPSTASH_REDIS_REST_URL', 'UPSTASH_REDIS_REST_TOKEN', 'KV_REST_API_URL', 'KV_REST_API_TOKEN');
  const saved = names.map((name) => process.env[name]);
  for (const name of names) delete process.env[name];
  Object.assign(process.env, vars);
  try {
    return await fn();
  } finally {
    names.forEach((name, i) => (saved[i] === undefined ? delete process.env[name] : (process.env[name] = saved[i])));
  }
}

// The JS reference store's algorithm (seeds/000): INCRBY, then PTTL, PEXPIRE only when there is no TTL.
const REFERENCE = `local count = redis.call('INCRBY', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return { count, ttl }`;

async function referenceHit(
  key: string,
  windowMs: number,
  amount: number,
): Promise<{ count: number; resetMs: number }> {
  const [count, resetMs] = (await server.cli('EVAL', REFERENCE, '1', prefix + key, String(windowMs), String(amount)))
    .split('\n')
    .map(Number);
  return { count, resetMs };
}

describe('redisStore', () => {
  it('is shared', () => {
    expect(make().shared).toBe(true);
  });

  it('checks the types of its options when it is made, and nothing that depends on the URL', () => {
    const create = redisStore as (options?: unknown) => unknown;
    for (const options of [
      'redis://x',
      null,
      { url: 5 },
      { token: {} },
      { prefix: 1 },
      { timeoutMs: '100' },
      { tls: 'ca' },
      { tls: { ca: 1 } },
      { waitForReplicas: '1' },
    ]) {
      expect(() => create(options), JSON.stringify(options)).toThrow(TypeError);
    }
    expect(() => create({ timeout: 5 })).toThrow(/unknown option "timeout"/);
    expect(() => create({ tls: { cert: 'x' } })).toThrow(/unknown option "tls.cert"/);
    for (const timeoutMs of [0, -1, 1.5, NaN, 2 ** 53]) expect(() => create({ timeoutMs })).toThrow(RangeError);
    for (const waitForReplicas of [-1, 1.5, NaN, 1001, Infinity]) {
      expect(() => create({ waitForReplicas }), String(waitForReplicas)).toThrow(/waitForReplicas must be an integer/);
    }
    expect(() => create({ waitForReplicas: 0 })).not.toThrow();
    for (const url of ['https://example.upstash.io', 'http://example.org', 'not a url', 'redis://:x@host/nodb']) {
      expect(() => create({ url })).not.toThrow();
    }
  });

  it('reads its environment on the first hit, not when it is made', async () => {
    const store = await withEnv({}, async () => redisStore({ prefix }));
    await withEnv({ REDIS_URL: server.url }, async () => {
      expect((await store.hit('env', 60_000, 2)).count).toBe(2);
    });
    await withEnv({ KV_URL: server.url }, async () => {
      expect((await redisStore({ prefix }).hit('env', 60_000, 1)).count).toBe(3);
    });
  });

  it('rejects the first hit without a URL, naming the variables it looked for', async () => {
    const error = await withEnv({}, () => rejection(redisStore().hit(KEY_MARKER, 1000, 1)));
    expect(error.code).toBe('ERR_CONFIG');
    expect(error.message).toMatch(/REDIS_URL, KV_URL .*UPSTASH_REDIS_REST_URL .*KV_REST_API_URL/);
    // Every later hit rejects the same way; the store reads its environment once.
    const store = redisStore();
    await withEnv({}, () => rejection(store.hit('a', 1000, 1)));
    await withEnv({ REDIS_URL: server.url }, async () => {
      expect((await rejection(store.hit('a', 1000, 1))).code).toBe('ERR_CONFIG');
    });
  });

  it('takes an https:// URL as a REST endpoint, which needs a token; http:// only on loopback', async () => {
    // Refused by the settings, so nothing is reached (redis-rest.spec.ts runs them against an endpoint).
    const error = await withEnv({ REDIS_URL: `https://${PASSWORD_MARKER}.example` }, () =>
      rejection(redisStore().hit(KEY_MARKER, 1000, 1)),
    );
    expect(error.code).toBe('ERR_CONFIG');
    expect(error.message).toMatch(/REDIS_URL is a REST URL .* UPSTASH_REDIS_REST_TOKEN/);
    const url = `http://default:${PASSWORD_MARKER}@${PASSWORD_MARKER}.example`;
    const plain = await rejection(redisStore({ url, token: TOKEN_MARKER }).hit(KEY_MARKER, 1000, 1));
    expect(plain.code).toBe('ERR_CONFIG');
    expect(plain.message).toMatch(/http:\/\/ URL is taken only on a loopback address/);
  });

  it('rejects URLs it cannot use on the first hit, naming where they came from but never showing them', async () => {
    for (const url of [PASSWORD_MARKER, `${PASSWORD_MARKER}:x`, `redis://:${PASSWORD_MARKER}@host/x`]) {
      const error = await rejection(redisStore({ url }).hit(KEY_MARKER, 1000, 1));
      expect(error.code).toBe('ERR_CONFIG');
      expect(error.message).toMatch(/^ratestore: redisStore: the url option/);
    }
    const error = await rejection(redisStore({ url: server.url, tls: { ca: 'not a certificate' } }).hit('k', 1000, 1));
    expect(error.code).toBe('ERR_CONFIG');
  });

  it('keeps the data layout of the JS reference store, so either can take over the counters', async () => {
    const store = make();
    const key = `layout:${randomUUID()}`;
    expect(await referenceHit(key, 60_000, 3)).toEqual({ count: 3, resetMs: 60_000 });
    const hit = await store.hit(key, 60_000, 2);
    expect(hit.count).toBe(5);
    expect(hit.resetMs).toBeGreaterThan(59_000);
    expect(hit.resetMs).toBeLessThanOrEqual(60_000);
    expect((await referenceHit(key, 60_000, 1)).count).toBe(6);
    expect((await store.hit(key, 60_000, 0)).count).toBe(6);

    const other = `layout:${randomUUID()}`;
    expect(await store.hit(other, 5_000, 4)).toEqual({ count: 4, resetMs: 5_000 });
    expect(await server.cli('GET', prefix + other)).toBe('4');
    const ttl = Number(await server.cli('PTTL', prefix + other));
    expect(ttl).toBeGreaterThan(4_000);
    expect(ttl).toBeLessThanOrEqual(5_000);
    const referenced = await referenceHit(other, 60_000, 1);
    expect(referenced.count).toBe(5);
    expect(referenced.resetMs).toBeLessThanOrEqual(5_000);
  });

  it('starts a new window on a counter left without a TTL, and never overwrites other data', async () => {
    const store = make();
    const key = `no-ttl:${randomUUID()}`;
    await server.cli('SET', prefix + key, '7');
    expect(await store.hit(key, 1_000, 0)).toEqual({ count: 0, resetMs: 1_000 });
    expect(await store.hit(key, 1_000, 2)).toEqual({ count: 2, resetMs: 1_000 });
    expect(Number(await server.cli('PTTL', prefix + key))).toBeGreaterThan(0);

    const text = `text:${KEY_MARKER}`;
    await server.cli('SET', prefix + text, 'not a number');
    const notCounter = await rejection(store.hit(text, 1_000, 1));
    expect(notCounter.code).toBe('ERR_REDIS');
    expect(notCounter.message).toMatch(/NOTCOUNTER/);
    expect(await server.cli('GET', prefix + text)).toBe('not a number');

    const hash = `hash:${KEY_MARKER}`;
    await server.cli('HSET', prefix + hash, 'field', '1');
    const wrongType = await rejection(store.hit(hash, 1_000, 1));
    expect(wrongType.code).toBe('ERR_REDIS');
    expect(wrongType.message).toMatch(/WRONGTYPE/);
    expect(await server.cli('TYPE', prefix + hash)).toBe('hash');
  });

  it('refuses a count past the safe-integer range with ERR_COUNT_RANGE, changing nothing', async () => {
    const store = make();
    const key = `range:${KEY_MARKER}`;
    await store.hit(key, 60_000, -Number.MAX_SAFE_INTEGER);
    const error = await rejection(store.hit(key, 60_000, -1));
    expect(error).toBeInstanceOf(RangeError);
    expect(error.code).toBe('ERR_COUNT_RANGE');
    expect((await store.hit(key, 60_000, 0)).count).toBe(-Number.MAX_SAFE_INTEGER);
    // A count the reference store let past the range is refused rather than rounded.
    await server.cli('SET', prefix + 'huge', '9007199254740993', 'PX', '60000');
    expect((await rejection(store.hit('huge', 60_000, 0))).code).toBe('ERR_COUNT_RANGE');
  });

  it('keeps keys under its prefix, and stores with other prefixes apart', async () => {
    const key = `prefix:${randomUUID()}`;
    await make().hit(key, 60_000, 3);
    expect(await server.cli('GET', prefix + key)).toBe('3');
    expect((await make({ prefix: `${prefix}other:` }).hit(key, 60_000, 1)).count).toBe(1);
  });

  it('closes: later hits reject with ERR_CLOSED, hits in flight still settle', async () => {
    const store = make();
    const key = `close:${randomUUID()}`;
    const inFlight = Array.from({ length: 20 }, () => store.hit(key, 60_000, 1));
    const closed = store.close();
    expect((await rejection(store.hit(KEY_MARKER, 60_000, 1))).code).toBe('ERR_CLOSED');
    expect((await Promise.all(inFlight)).map((h) => h.count).sort((a, b) => a - b)).toEqual(
      Array.from({ length: 20 }, (_, i) => i + 1),
    );
    await closed;
    expect((await rejection(store.hit(key, 60_000, 1))).code).toBe('ERR_CLOSED');
    expect(await server.cli('GET', prefix + key)).toBe('20');
    const never = redisStore({ url: 'redis://127.0.0.1:1' });
    await never.close();
    expect((await rejection(never.hit('k', 1000, 1))).code).toBe('ERR_CLOSED');
  });

  it('answers many concurrent hits on many keys exactly', async () => {
    const store = make();
    const run = randomUUID();
    const hits = await Promise.all(
      Array.from({ length: 2_000 }, (_, i) => store.hit(`many:${run}:${i % 10}`, 60_000, 1)),
    );
    const counts = new Map<number, number[]>();
    hits.forEach((hit, i) => counts.set(i % 10, [...(counts.get(i % 10) ?? []), hit.count]));
    for (const seen of counts.values()) {
      expect(seen.sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    }
  });

  it('counts hits from 4 worker threads, each with its own store, exactly', async () => {
    const key = `workers:${randomUUID()}`;
    const hits = 500;
    const counts = await hitFromWorkers(4, { factory: 'redisStore', options: { url: server.url, prefix }, key, hits });
    expect(counts).toEqual(Array.from({ length: 4 * hits }, (_, i) => i + 1));
    expect((await make().hit(key, 60_000, 0)).count).toBe(4 * hits);
  });

  it('closes the connection of a store nobody holds any more', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    // Every client but the redis-cli that asks.
    const clients = async () =>
      new Set(
        (await server.cli('CLIENT', 'LIST'))
          .split('\n')
          .filter((line) => !line.includes('cmd=client'))
          .map((line) => line.split(' ')[0]),
      );
    const before = await clients();
    // A database of its own: stores with the same server and credentials share their connection.
    const own = new URL(server.url);
    own.pathname = '/5';
    let store: ReturnType<typeof make> | undefined = make({ url: own.href });
    await store.hit(`gc:${randomUUID()}`, 60_000, 1);
    const opened = [...(await clients())].filter((id) => !before.has(id));
    expect(opened).toHaveLength(1);
    store = undefined;
    const deadline = Date.now() + 10_000;
    while ((await clients()).has(opened[0]) && Date.now() < deadline) {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect((await clients()).has(opened[0])).toBe(false);
  });

  it('resetAll unlinks only keys under its prefix, with SCAN; an empty prefix is refused', async () => {
    const mine = `reset-all:${randomUUID()}:`;
    const store = make({ prefix: mine });
    await Promise.all(Array.from({ length: 2_500 }, (_, i) => store.hit(`k${i}`, 60_000, 1)));
    await store.slidingWindow.increment('k0', 60_000, 1);
    // Outside the prefix: a longer prefix that starts the same, and a glob character.
    await server.cli('SET', `${mine.slice(0, -1)}x`, 'keep');
    await server.cli('SET', `other:${randomUUID()}`, 'keep');
    const before = Number(await server.cli('DBSIZE'));
    await store.resetAll();
    expect(await server.cli('--scan', '--pattern', `${mine}*`)).toBe('');
    expect(Number(await server.cli('DBSIZE'))).toBe(before - 2_501);
    expect(await server.cli('GET', `${mine.slice(0, -1)}x`)).toBe('keep');
    const empty = await rejection(make({ prefix: '' }).resetAll());
    expect(empty.code).toBe('ERR_CONFIG');
    expect(empty.message).toMatch(/empty prefix/);
  });

  describe('lets a process exit by itself', () => {
    const script = join(__dirname, 'fixtures', 'redis-exits.js');

    it('when it made stores and set no variables', async () => {
      expect(await runFixture(script, ['construct'])).toBe('made');
    });

    it('when a store that did hits is left idle, without close()', async () => {
      expect(await runFixture(script, ['hits', server.url])).toBe('done');
    });

    it('after garbage collections between hits, each of which settles', async () => {
      expect(await runFixture(script, ['gc', server.url], ['--expose-gc'])).toBe('counted 2');
    });

    it('only once a hit in flight has settled', async () => {
      expect(await runFixture(script, ['in-flight', server.url])).toBe('settled 1');
    });
  });

  it('uses next to no CPU while idle after hits', async () => {
    const report = await runFixture(join(__dirname, 'fixtures', 'redis-exits.js'), ['idle', server.url]);
    const used = Number(/used (\d+) ms/.exec(report)?.[1]);
    // An I/O thread that kept polling would use about 500 ms.
    expect(used).toBeLessThan(150);
  });
});
