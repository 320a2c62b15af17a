// redisStore over Upstash's REST API, against the test endpoint of that
// protocol (scripts/rest-endpoint.js) in front of a real redis-server.
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer, connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  redisStore,
  type ConnectionEvent,
  type RatestoreError,
  type RedisStore,
  type RedisStoreOptions,
} from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite, redisOrderSuite, tickApart } from './operations-suite.js';
import { universalSuite } from './universal-suite.js';
import {
  errorText,
  makeCertificates,
  rejection as rejectionOf,
  runFixture,
  startRedis,
  type RedisServer,
} from './support/redis.js';
import { interleavingProxy, listenOnLoopback, overtakenPair } from './support/proxy.js';
import { startRest, type RestEndpoint } from './support/rest.js';

const TOKEN = `rest-token-${randomUUID()}`;
const KEY_MARKER = '192.0.2.44-rest-key-marker';
const TOKEN_MARKER = 'rest-token-marker-3e8f';
const VARIABLES = [
  'REDIS_URL',
  'KV_URL',
  'REDIS_TOKEN',
  'REDIS_CLUSTER',
  'UPSTASH_REDIS_REST_URL',
  'UPSTASH_REDIS_REST_TOKEN',
  'KV_REST_API_URL',
  'KV_REST_API_TOKEN',
];
const TOKEN_VARIABLES = ['UPSTASH_REDIS_REST_TOKEN', 'KV_REST_API_TOKEN'];
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let redis: RedisServer;
let rest: RestEndpoint;
let tlsRest: RestEndpoint;
let ca: string;
const certificates = mkdtempSync(join(tmpdir(), 'ratestore-rest-tls-'));
beforeAll(async () => {
  redis = await startRedis();
  const files = await makeCertificates(certificates);
  ca = readFileSync(files.ca, 'utf8');
  [rest, tlsRest] = await Promise.all([
    startRest({ redisPort: redis.port, token: TOKEN }),
    startRest({ redisPort: redis.port, token: TOKEN, tls: files }),
  ]);
});
afterAll(async () => {
  await Promise.all([rest?.stop(), tlsRest?.stop()]);
  await redis?.stop();
  rmSync(certificates, { recursive: true, force: true });
});

const prefix = `rest:${randomUUID()}:`;
const stores: RedisStore[] = [];
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
afterAll(() => Promise.all(stores.map((store) => store.close())));
const make = (options: RedisStoreOptions = {}) => {
  const store = redisStore({ url: rest.url, token: TOKEN, prefix, timeoutMs: 5_000, ...options });
  stores.push(store);
  return store;
};
const overTls = () => make({ url: tlsRest.url, tls: { ca } });

rateLimitStoreContract('redisStore over REST', () => make());
rateLimitStoreContract('redisStore over REST with HTTPS', overTls);
limiterSuite('redisStore over REST', () => make());
operationsSuite('redisStore over REST', () => make());
universalSuite('redisStore over REST', () => make());
redisOrderSuite('redisStore over REST', make, () => redis.cli('SCRIPT', 'FLUSH'));

describe('redisStore over REST: order of calls', () => {
  it('keeps calls on one key in order when a later one takes a connection freed before an earlier one connects', async () => {
    // New connections reach the endpoint 30 ms late; a kept-alive one goes at once.
    const sockets: Socket[] = [];
    const port = Number(new URL(rest.url).port);
    const proxy = createServer((client) => {
      client.pause();
      sockets.push(client);
      setTimeout(() => {
        const upstream = connect(port, '127.0.0.1');
        sockets.push(upstream);
        for (const socket of [client, upstream])
          socket.on('error', () => [client, upstream].forEach((x) => x.destroy()));
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      }, 30);
    });
    const proxyPort = await listenOnLoopback(proxy, sockets, cleanups);
    const rounds: number[][] = [];
    for (let round = 0; round < 10; round++) {
      // Settings of its own: a new pool each round, one connection open and idle.
      const store = make({
        url: `http://127.0.0.1:${proxyPort}`,
        timeoutMs: 5_000 + round,
      });
      rounds.push(await tickApart(store));
      await store.close();
    }
    expect(rounds).toEqual(rounds.map(() => [1, 2, 3, 4]));
  });
});

const rejection = (pending: Promise<unknown>) => rejectionOf(pending, [KEY_MARKER, TOKEN_MARKER, TOKEN]);

/** Runs `fn` with only the given Redis variables in process.env, restoring them after. */
async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const saved = VARIABLES.map((name) => process.env[name]);
  for (const name of VARIABLES) delete process.env[name];
  Object.assign(process.env, vars);
  try {
    return await fn();
  } finally {
    VARIABLES.forEach((name, i) =>
      saved[i] === undefined ? delete process.env[name] : (process.env[name] = saved[i]),
    );
  }
}

/** An endpoint of the test's own (to kill or pause), on the shared redis-server. */
async function ownEndpoint(): Promise<RestEndpoint> {
  const endpoint = await startRest({ redisPort: redis.port, token: TOKEN });
  cleanups.push(() => endpoint.stop());
  return endpoint;
}

/** Hits until one counts, for at most `ms`: the codes seen, then the count. */
async function untilCounted(store: RedisStore, key: string, ms: number): Promise<(number | string)[]> {
  const seen: (number | string)[] = [];
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    try {
      seen.push((await store.hit(key, 60_000, 1)).count);
      break;
    } catch (error) {
      seen.push((await rejection(Promise.reject(error))).code);
      await sleep(20);
    }
  }
  return seen;
}

describe('redisStore over REST', () => {
  it('counts 2,000 parallel hits exactly, as pipelines on kept-alive connections', async () => {
    const store = make();
    const run = randomUUID();
    const before = await rest.stats();
    const hits = await Promise.all(
      Array.from({ length: 2_000 }, (_, i) => store.hit(`many:${run}:${i % 10}`, 60_000, 1)),
    );
    const counts = new Map<number, number[]>();
    hits.forEach((hit, i) => counts.set(i % 10, [...(counts.get(i % 10) ?? []), hit.count]));
    for (const seen of counts.values()) {
      expect(seen.sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    }
    const after = await rest.stats();
    // Several hits a request on average (how many depends on how the I/O thread and the event loop
    // interleave on a loaded machine), on fewer connections than requests.
    expect(after.pipelines - before.pipelines).toBeLessThanOrEqual(2_000 / 3);
    expect(after.connections - before.connections).toBeLessThan(after.requests - before.requests);
  });

  it('keeps the Redis data layout: counters continue from REST to TCP and back', async () => {
    const overRest = make();
    const overTcp = redisStore({ url: redis.url, prefix });
    cleanups.push(() => overTcp.close());
    const key = `layout:${randomUUID()}:\u00e9\u{1f600}`;
    expect((await overRest.hit(key, 60_000, 3)).count).toBe(3);
    expect(await redis.cli('GET', prefix + key)).toBe('3');
    expect((await overTcp.hit(key, 60_000, 2)).count).toBe(5);
    expect((await overRest.hit(key, 60_000, 1)).count).toBe(6);
    const ttl = Number(await redis.cli('PTTL', prefix + key));
    expect(ttl).toBeGreaterThan(55_000);
    expect((await overTcp.consume(key, { limit: 7, windowMs: 60_000 })).count).toBe(7);
    expect((await overRest.consume(key, { limit: 7, windowMs: 60_000 })).allowed).toBe(false);
    await overRest.slidingWindow.increment(key, 60_000, 4);
    expect((await overTcp.slidingWindow.increment(key, 60_000, 0)).count).toBe(4);
    const bucket = { capacity: 5, refill: 1, intervalMs: 60_000, cost: 2 };
    expect((await overTcp.tokenBucket(key, bucket)).remaining).toBe(3);
    expect((await overRest.tokenBucket(key, bucket)).remaining).toBe(1);
    await overTcp.reset(key);
    expect((await overRest.hit(key, 60_000, 0)).count).toBe(0);
  });

  it('reads UPSTASH_REDIS_REST_URL and _TOKEN, else KV_REST_API_URL and _TOKEN, on the first hit', async () => {
    const key = `env:${randomUUID()}`;
    const upstash = await withEnv({}, async () => redisStore({ prefix }));
    const kv = redisStore({ prefix });
    stores.push(upstash, kv);
    await withEnv({ UPSTASH_REDIS_REST_URL: rest.url, UPSTASH_REDIS_REST_TOKEN: TOKEN }, async () => {
      expect((await upstash.hit(key, 60_000, 2)).count).toBe(2);
    });
    await withEnv({ KV_REST_API_URL: rest.url, KV_REST_API_TOKEN: TOKEN }, async () => {
      expect((await kv.hit(key, 60_000, 1)).count).toBe(3);
    });
    // REDIS_URL (the Redis protocol) wins over the REST variables, whose endpoint here refuses the token.
    await withEnv(
      { REDIS_URL: redis.url, UPSTASH_REDIS_REST_URL: rest.url, UPSTASH_REDIS_REST_TOKEN: TOKEN_MARKER },
      async () => {
        const store = redisStore({ prefix });
        stores.push(store);
        expect((await store.hit(key, 60_000, 1)).count).toBe(4);
      },
    );
    const error = await withEnv({}, () => rejection(redisStore().hit(KEY_MARKER, 1000, 1)));
    expect(error.code).toBe('ERR_CONFIG');
    for (const name of VARIABLES.filter((name) => !/TOKEN|CLUSTER/.test(name)).concat(TOKEN_VARIABLES)) {
      expect(error.message).toContain(name);
    }
  });

  it('refuses a REST URL without a token, and http:// off a loopback address', async () => {
    const noToken = await withEnv({ UPSTASH_REDIS_REST_URL: rest.url }, () =>
      rejection(redisStore().hit(KEY_MARKER, 1000, 1)),
    );
    expect(noToken.code).toBe('ERR_CONFIG');
    expect(noToken.message).toMatch(/UPSTASH_REDIS_REST_URL is a REST URL .*UPSTASH_REDIS_REST_TOKEN/);
    const offLoopback = await rejection(
      redisStore({ url: `http://${TOKEN_MARKER}.example`, token: TOKEN }).hit(KEY_MARKER, 1000, 1),
    );
    expect(offLoopback.code).toBe('ERR_CONFIG');
    expect(offLoopback.message).toMatch(/only on a loopback address/);
  });

  it('refuses a wrong token with ERR_AUTH (HTTP 401), showing it nowhere', async () => {
    const error = await rejection(make({ token: TOKEN_MARKER }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_AUTH');
    expect(error.message).toMatch(/HTTP 401/);
    // The URL's password is a token too, and the option wins over it.
    const url = new URL(rest.url);
    url.password = TOKEN_MARKER;
    expect((await rejection(make({ url: url.href, token: undefined }).hit(KEY_MARKER, 60_000, 1))).code).toBe(
      'ERR_AUTH',
    );
    expect((await make({ url: url.href }).hit(`auth:${randomUUID()}`, 60_000, 1)).count).toBe(1);
  });

  it('answers a command error as ERR_REDIS, changing nothing', async () => {
    const store = make();
    const hash = `hash:${KEY_MARKER}`;
    await redis.cli('HSET', prefix + hash, 'field', '1');
    const error = await rejection(store.hit(hash, 1_000, 1));
    expect(error.code).toBe('ERR_REDIS');
    expect(error.message).toMatch(/WRONGTYPE/);
    expect(await redis.cli('TYPE', prefix + hash)).toBe('hash');
    const key = `range:${KEY_MARKER}`;
    await store.hit(key, 60_000, Number.MAX_SAFE_INTEGER);
    expect(await rejection(store.hit(key, 60_000, 1))).toBeInstanceOf(RangeError);
  });

  it('sends a script as EVAL after NOSCRIPT, once per hit, and EVALSHA after that', async () => {
    const store = make();
    const key = `noscript:${randomUUID()}`;
    await store.hit(key, 60_000, 1);
    const calls = async (command: string) =>
      Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(await redis.cli('INFO', 'commandstats'))?.[1] ?? 0);
    await redis.cli('SCRIPT', 'FLUSH');
    const [evals, evalshas] = [await calls('eval'), await calls('evalsha')];
    const hits = await Promise.all(Array.from({ length: 10 }, () => store.hit(key, 60_000, 1)));
    expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual(Array.from({ length: 10 }, (_, i) => i + 2));
    expect(await calls('eval')).toBeGreaterThan(evals);
    expect(await calls('eval')).toBeLessThanOrEqual(evals + 10);
    expect((await store.hit(key, 60_000, 0)).count).toBe(11);
    expect(await calls('evalsha')).toBeGreaterThan(evalshas + 10);
  });

  it('after SCRIPT FLUSH, a call overtaken by a later one on its key (another client loaded the script between them) rejects unsent', async () => {
    // The endpoint reaches Redis through a proxy that lets another client's command land between two
    // of a pipeline's calls.
    const own = await startRedis();
    cleanups.push(() => own.stop());
    const proxy = await interleavingProxy(own.port, cleanups);
    const endpoint = await startRest({ redisPort: proxy.port, token: TOKEN });
    cleanups.push(() => endpoint.stop());
    const store = redisStore({ url: endpoint.url, token: TOKEN, prefix, timeoutMs: 5_000 });
    cleanups.push(() => store.close());
    expect((await store.hit(`overtaken:${randomUUID()}`, 60_000, 1)).count).toBe(1);
    const key = () => `overtaken:${randomUUID()}`;
    const { first, second, after } = await overtakenPair(store, proxy, (...a) => own.cli(...a), key);
    expect(second).toBe(2);
    expect(first).toMatchObject({ code: 'ERR_REDIS', sent: false });
    expect((first as { message: string }).message).toMatch(/did not run \(nothing was counted\)/);
    expect(after).toBe(2);
  });

  it('refuses a key with a lone surrogate with a TypeError, sending nothing', async () => {
    const store = make();
    const before = await rest.stats();
    for (const key of ['\ud800', `${KEY_MARKER}\udc00x`]) {
      const error = await rejection(store.hit(key, 60_000, 1));
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).toMatch(/well-formed string/);
      expect(await rejection(store.consume(key, { limit: 1, windowMs: 1_000 }))).toBeInstanceOf(TypeError);
    }
    expect((await rest.stats()).commands).toBe(before.commands);
  });

  it('rejects the hits of a batch when the endpoint is killed, sends none again, and counts once it is back', async () => {
    const endpoint = await ownEndpoint();
    const store = make({ url: endpoint.url, timeoutMs: 2_000 });
    const key = `killed:${KEY_MARKER}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    // Paused, then killed: the batch is on its way and never answered.
    endpoint.signal('SIGSTOP');
    const batch = Array.from({ length: 40 }, () => rejection(store.hit(key, 60_000, 1)));
    await sleep(200);
    endpoint.signal('SIGKILL');
    const errors = await Promise.all(batch);
    // Pipelines on one key go one after the other: those behind the first were never sent.
    expect(errors.map((e) => e.code)).toEqual(errors.map(() => 'ERR_CONNECTION'));
    expect(errors[0].sent).toBe(true);
    expect(errors[0].message).toMatch(/may or may not have counted/);
    // While it is down: refused connects, never sent. The first call may still meet a pooled
    // connection whose reset the client has not read yet on a loaded machine: its request was written
    // (sent: true) to an endpoint that is gone, so it reached nothing; the call after it connects anew.
    await endpoint.exited();
    let down = await rejection(store.hit(key, 60_000, 1));
    if (down.code === 'ERR_CONNECTION' && down.sent === true) down = await rejection(store.hit(key, 60_000, 1));
    expect([down.code, down.sent]).toEqual(['ERR_CONNECTION', false]);
    await endpoint.restart();
    const seen = await untilCounted(store, key, 5_000);
    // None of the 40 reached Redis before the kill, and none was sent again after it.
    expect(seen.at(-1)).toBe(2);
    expect(await redis.cli('GET', prefix + key)).toBe('2');
  });

  it('stats(): one latency sample per hit, the connections the endpoint accepted, a killed endpoint as a loss and a reconnect', async () => {
    const endpoint = await ownEndpoint();
    const seen: (RatestoreError | ConnectionEvent)[] = [];
    const store = make({ url: endpoint.url, timeoutMs: 2_000, onError: (e) => seen.push(e) });
    const events = () => seen.filter((e) => !(e instanceof Error));
    const key = `stats:${KEY_MARKER}`;
    expect(store.stats()).toMatchObject({ connects: 0, reconnects: 0, connectFailures: 0, connectionLosses: 0 });
    for (let i = 0; i < 10; i++) await store.hit(key, 60_000, 1);
    await Promise.all(Array.from({ length: 300 }, () => store.hit(key, 60_000, 1)));
    let s = store.stats();
    expect(s.latencyMs.count).toBe(310);
    expect(s.latencyMs.p50).toBeGreaterThan(0);
    expect(s.latencyMs.p99).toBeLessThanOrEqual(s.latencyMs.max);
    // Every connection the endpoint accepted but the one this stats() request came on.
    const accepted = (await endpoint.stats()).connections - 1;
    expect(accepted).toBeGreaterThan(0);
    expect(s).toMatchObject({ connects: accepted, reconnects: 0, connectFailures: 0, connectionLosses: 0 });
    expect(events()).toEqual([{ type: 'connected' }]);

    endpoint.signal('SIGKILL');
    await sleep(100);
    const down = await rejection(store.hit(key, 60_000, 1));
    expect(down.code).toBe('ERR_CONNECTION');
    expect(events()).toEqual([{ type: 'connected' }, { type: 'lost', code: 'ERR_CONNECTION' }]);
    await endpoint.restart();
    const counted = await untilCounted(store, key, 5_000);
    expect(counted.at(-1)).toBe(311);
    await sleep(50); // the events come with the next delivery
    s = store.stats();
    expect(s.latencyMs.count).toBe(311);
    expect(s.connectionLosses).toBe(1);
    expect(s.reconnects).toBe(1);
    expect(s.connectFailures).toBeGreaterThan(0);
    expect(s.connects).toBe(accepted + (await endpoint.stats()).connections - 1);
    expect(events()).toEqual([
      { type: 'connected' },
      { type: 'lost', code: 'ERR_CONNECTION' },
      { type: 'reconnected' },
    ]);
    // Every failed hit was told once, with the error it rejected with; nothing told holds the key or token.
    expect(seen.filter((e) => e instanceof Error).length).toBe(counted.length);
    const told = JSON.stringify(seen, (_, v: unknown) => (v instanceof Error ? errorText(v) : v));
    expect(told).not.toContain(KEY_MARKER);
    expect(told).not.toContain(TOKEN);
  });

  it('times out on a stalled endpoint within timeoutMs, and recovers once it answers', async () => {
    const endpoint = await ownEndpoint();
    const store = make({ url: endpoint.url, timeoutMs: 400 });
    const key = `stalled:${KEY_MARKER}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    endpoint.signal('SIGSTOP');
    const started = performance.now();
    const error = await rejection(store.hit(key, 60_000, 1));
    const elapsed = performance.now() - started;
    expect([error.code, error.sent]).toEqual(['ERR_TIMEOUT', true]);
    expect(elapsed).toBeGreaterThanOrEqual(390);
    expect(elapsed).toBeLessThan(1_000);
    const more = await Promise.all(Array.from({ length: 5 }, () => rejection(store.hit(key, 60_000, 1))));
    expect(more.every((e) => e.code === 'ERR_TIMEOUT')).toBe(true);
    endpoint.signal('SIGCONT');
    const seen = await untilCounted(store, key, 5_000);
    expect(typeof seen.at(-1)).toBe('number');
  });

  it('speaks HTTPS over HTTP/2 with tls.ca, and refuses an endpoint it does not trust', async () => {
    const store = overTls();
    const run = randomUUID();
    await store.hit(`tls:${run}:warm-up`, 60_000, 1);
    const before = await tlsRest.stats();
    const hits = await Promise.all(Array.from({ length: 300 }, (_, i) => store.hit(`tls:${run}:${i % 3}`, 60_000, 1)));
    expect(Math.max(...hits.map((h) => h.count))).toBe(100);
    const after = await tlsRest.stats();
    const requests = after.requests - before.requests;
    // At least one /pipeline per 128 hits, every one over HTTP/2.
    expect(requests).toBeGreaterThanOrEqual(300 / 128);
    expect((after.httpVersions['2.0'] ?? 0) - (before.httpVersions['2.0'] ?? 0)).toBe(requests);
    // The HTTP/2 connection of the warm-up carries them all.
    expect(after.connections).toBe(before.connections);
    const untrusted = await rejection(make({ url: tlsRest.url }).hit(KEY_MARKER, 60_000, 1));
    expect([untrusted.code, untrusted.sent]).toEqual(['ERR_CONNECTION', false]);
    expect(untrusted.message).toMatch(/certificate/i);
  });

  it('lets a process exit by itself when a store that did hits is left idle', async () => {
    const url = new URL(rest.url);
    url.password = TOKEN;
    expect(await runFixture(join(__dirname, 'fixtures', 'redis-exits.js'), ['hits', url.href])).toBe('done');
  });
});
