// universalStore and expressStore over memoryStore and redisStore (one redis-server of this suite's
// own), the checks of their options, their errors, and two Express processes sharing one count.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expressStore, memoryStore, redisStore, universalStore, type RedisStore } from '../index.js';
import { expressSuite, recorder } from './express-suite.js';
import { send, serve } from './support/http.js';
import { errorText, plainRedis, rejection as rejectionOf } from './support/redis.js';
import { rateLimit as universalRateLimit, requestFrom } from './support/universal.js';
import { universalSuite } from './universal-suite.js';

let server: Awaited<ReturnType<typeof plainRedis>>;
beforeAll(async () => {
  server = await plainRedis();
});
afterAll(() => server?.stop());

const stores: RedisStore[] = [];
afterAll(() => Promise.all(stores.splice(0).map((store) => store.close())));
/** A redisStore with a prefix of its own, so that resetAll() empties only what its test wrote. */
const redis = (prefix = `test:${randomUUID()}:`) => {
  const store = redisStore({ url: server.url, prefix, timeoutMs: 5_000 });
  stores.push(store);
  return store;
};

universalSuite('memoryStore', () => memoryStore());
universalSuite('redisStore', () => redis());
expressSuite('memoryStore', () => memoryStore());
expressSuite('redisStore', () => redis());

const KEY_MARKER = '203.0.113.77-key-marker';

const rejection = (pending: Promise<unknown>) => rejectionOf(pending, [KEY_MARKER]);

describe('universalStore', () => {
  it('checks its options: TypeError for a wrong type, RangeError for a value out of range', () => {
    const make = (options: unknown) => () => universalStore(options as Parameters<typeof universalStore>[0]);
    expect(make(undefined)).toThrow(TypeError);
    expect(make({})).toThrow(/windowMs must be a number/);
    expect(make({ windowMs: '1000' })).toThrow(TypeError);
    expect(make({ windowMs: 0 })).toThrow(RangeError);
    expect(make({ windowMs: 1.5 })).toThrow(RangeError);
    expect(make({ windowMs: 2 ** 53 })).toThrow(RangeError);
    expect(make({ windowMs: 4_503_599_627_371 })).toThrow(RangeError);
    expect(make({ windowMs: 1000, algorithm: 'token-bucket' })).toThrow(RangeError);
    expect(make({ windowMs: 1000, algorithm: 1 })).toThrow(TypeError);
    expect(make({ windowMs: 1000, store: {} })).toThrow(/store must be a ratestore store/);
    expect(make({ windowMs: 1000, store: { hit: async () => ({ count: 1, resetMs: 1 }) } })).toThrow(TypeError);
    expect(make({ windowMs: 1000, limit: 5 })).toThrow(/unknown option "limit"/);
  });

  it('defaults to a fixed window over a memoryStore of its own', async () => {
    const a = universalStore({ windowMs: 60_000 });
    const b = universalStore({ windowMs: 60_000 });
    expect((await a.increment('k')).totalHits).toBe(1);
    expect((await a.increment('k')).totalHits).toBe(2);
    expect((await b.increment('k')).totalHits).toBe(1);
  });

  it('counts on the store it is given, which its other users see', async () => {
    const store = memoryStore();
    const adapter = universalStore({ windowMs: 60_000, store });
    await adapter.increment('k');
    await adapter.increment('k');
    expect((await store.hit('k', 60_000, 0)).count).toBe(2);
  });

  it('rejects with the store error when the store cannot count, naming no key', async () => {
    const dead = redisStore({ url: 'redis://127.0.0.1:1', timeoutMs: 1_000 });
    for (const algorithm of ['fixed-window', 'sliding-window'] as const) {
      const adapter = universalStore({ windowMs: 60_000, algorithm, store: dead });
      const error = await rejection(adapter.increment(KEY_MARKER));
      expect(error.code).toBe('ERR_CONNECTION');
      await rejection(adapter.decrement(KEY_MARKER));
      await rejection(adapter.resetKey(KEY_MARKER));
      // The driver re-throws it, or lets the request through with passOnStoreError.
      const strict = universalRateLimit({ windowMs: 60_000, limit: 5, store: adapter });
      await rejection(strict(requestFrom(KEY_MARKER)));
      const open = universalRateLimit({ windowMs: 60_000, limit: 5, store: adapter, passOnStoreError: true });
      expect((await open(requestFrom(KEY_MARKER))).limited).toBe(false);
    }
    await dead.close();
  });

  it('names no key in a bad-input error', async () => {
    const adapter = universalStore({ windowMs: 60_000 });
    const long = KEY_MARKER.repeat(100_000);
    expect((await rejection(adapter.increment(long))).constructor).toBe(RangeError);
    expect((await rejection(adapter.decrement(long))).constructor).toBe(RangeError);
  });

  it('aligns sliding windows on the Redis server clock', async () => {
    const windowMs = 10_000;
    const adapter = universalStore({ windowMs, algorithm: 'sliding-window', store: redis() });
    const { resetTime } = await adapter.increment(randomUUID());
    // resetTime is read after the reply, rounded up: a few ms past the aligned end at most.
    expect(resetTime.getTime() % windowMs).toBeLessThanOrEqual(20);
  });
});

describe('expressStore', () => {
  it('checks its options: TypeError for a wrong type, RangeError for a value out of range', () => {
    const make = (options: unknown) => () => expressStore(options as Parameters<typeof expressStore>[0]);
    expect(make(undefined)).not.toThrow();
    expect(make(null)).toThrow(TypeError);
    expect(make({ algorithm: 'leaky-bucket' })).toThrow(RangeError);
    expect(make({ algorithm: null })).toThrow(TypeError);
    expect(make({ prefix: 5 })).toThrow(TypeError);
    expect(make({ prefix: '\ud800' })).toThrow(/well-formed/);
    expect(make({ store: { hit() {} } })).toThrow(/store must be a ratestore store/);
    expect(make({ windowMs: 60_000 })).toThrow(/unknown option "windowMs"/);
  });

  it('takes windowMs from init(); calls before it reject, and init() refuses a bad windowMs', async () => {
    const store = expressStore();
    const error = await rejection(store.increment(KEY_MARKER));
    expect(error.code).toBe('ERR_NOT_INITIALIZED');
    expect((await rejection(store.get(KEY_MARKER))).code).toBe('ERR_NOT_INITIALIZED');
    expect((await rejection(store.decrement(KEY_MARKER))).code).toBe('ERR_NOT_INITIALIZED');
    const init = store.init as (options: unknown) => void;
    expect(() => init.call(store, undefined)).toThrow(TypeError);
    expect(() => init.call(store, { windowMs: '60000' })).toThrow(TypeError);
    expect(() => init.call(store, { windowMs: 0 })).toThrow(RangeError);
    expect(() => init.call(store, { windowMs: 2.5 })).toThrow(RangeError);
    store.init({ windowMs: 1_000 });
    expect(await store.increment(KEY_MARKER)).toMatchObject({ totalHits: 1 });
    expect(() => store.init({ windowMs: 1_000 })).toThrow(/init\(\) was called again/);
  });

  it('resolves every method as express-rate-limit expects', async () => {
    const store = expressStore({ store: memoryStore() });
    store.init({ windowMs: 60_000 });
    const hit = await store.increment('k');
    expect(hit.totalHits).toBe(1);
    expect(hit.resetTime).toBeInstanceOf(Date);
    expect(await store.get('k')).toMatchObject({ totalHits: 1 });
    await expect(store.decrement('k')).resolves.toBeUndefined();
    // A fixed window stays open at 0 after a decrement, as express-rate-limit's MemoryStore keeps it.
    expect(await store.get('k')).toMatchObject({ totalHits: 0 });
    await expect(store.decrement('k')).resolves.toBeUndefined();
    expect((await store.increment('k')).totalHits).toBe(1);
    await expect(store.resetKey('k')).resolves.toBeUndefined();
    expect(await store.get('k')).toBeUndefined();
    await store.increment('k');
    await expect(store.resetAll()).resolves.toBeUndefined();
    expect(await store.get('k')).toBeUndefined();
    expect(store.shutdown()).toBeUndefined();
    expect((await store.increment('k')).totalHits).toBe(1);
  });

  it('rejects a key that is not a string with a TypeError', async () => {
    const store = expressStore();
    store.init({ windowMs: 60_000 });
    const methods = store as unknown as Record<string, (key: unknown) => Promise<unknown>>;
    for (const method of ['get', 'increment', 'decrement', 'resetKey']) {
      const pending = methods[method](42);
      expect(pending).toBeInstanceOf(Promise);
      await expect(pending).rejects.toThrow(TypeError);
    }
  });

  it('keeps counts apart by prefix on one store', async () => {
    const shared = redis();
    const a = expressStore({ store: shared, prefix: 'a:' });
    const b = expressStore({ store: shared, prefix: 'b:' });
    a.init({ windowMs: 60_000 });
    b.init({ windowMs: 60_000 });
    await a.increment('k');
    await a.increment('k');
    expect((await b.increment('k')).totalHits).toBe(1);
    expect((await shared.hit('a:k', 60_000, 0)).count).toBe(2);
    expect(a.prefix).toBe('a:');
    await b.resetKey('k');
    expect((await a.get('k'))?.totalHits).toBe(2);
  });

  it("passes express-rate-limit's validations: two limiters on one request, each with its own prefix", async () => {
    const log = recorder();
    const shared = redis();
    const app = express();
    const limiters = ['burst:', 'hour:'].map((prefix, i) =>
      rateLimit({
        store: expressStore({ store: shared, prefix }),
        limit: i === 0 ? 2 : 3,
        windowMs: 60_000,
        logger: log.logger,
      }),
    );
    app.use(...limiters);
    app.get('/ok', (_request, response) => {
      response.send('ok');
    });
    const served = await serve(app);
    try {
      const statuses = [];
      for (let i = 0; i < 4; i++) statuses.push((await send(served.url + '/ok')).status);
      expect(statuses).toEqual([200, 200, 429, 429]);
      expect((await shared.hit('burst:127.0.0.1', 60_000, 0)).count).toBe(4);
      // The second limiter only counts the requests the first let through.
      expect((await shared.hit('hour:127.0.0.1', 60_000, 0)).count).toBe(2);
      expect(log.logged).toEqual([]);
    } finally {
      await served.close();
    }
  });

  it('is caught by express-rate-limit when one expressStore is given to two limiters', () => {
    const log = recorder();
    const store = expressStore();
    rateLimit({ store, logger: log.logger });
    rateLimit({ store, logger: log.logger });
    expect(log.logged.join('\n')).toContain('ERR_ERL_STORE_REUSE');
  });

  it('refuses a second expressStore with the same store and prefix until the first shuts down', () => {
    const shared = memoryStore();
    const log = recorder();
    const first = expressStore({ store: shared });
    rateLimit({ store: first, logger: log.logger });
    expect(log.logged).toEqual([]);
    rateLimit({ store: expressStore({ store: shared }), logger: log.logger });
    expect(log.logged).toHaveLength(1);
    expect(log.logged[0]).toMatch(/^error: .*another expressStore already counts on this ratestore store/);
    rateLimit({ store: expressStore({ store: shared, prefix: 'other:' }), logger: log.logger });
    expect(log.logged).toHaveLength(1);
    first.shutdown();
    rateLimit({ store: expressStore({ store: shared }), logger: log.logger });
    expect(log.logged).toHaveLength(1);
  });

  it('fails a request with the store error, naming no key, or lets it through with passOnStoreError', async () => {
    const dead = redisStore({ url: 'redis://127.0.0.1:1', timeoutMs: 1_000 });
    const log = recorder();
    const app = express();
    app.use(
      '/strict',
      rateLimit({
        store: expressStore({ store: dead, prefix: 'strict:' }),
        keyGenerator: () => KEY_MARKER,
        logger: log.logger,
      }),
    );
    app.use(
      '/open',
      rateLimit({
        store: expressStore({ store: dead, prefix: 'open:' }),
        keyGenerator: () => KEY_MARKER,
        passOnStoreError: true,
        logger: log.logger,
      }),
    );
    app.get(['/strict', '/open'], (_request, response) => {
      response.send('ok');
    });
    // Express's error handler answers 500 with the error's stack outside production.
    app.use((error: unknown, _request: express.Request, response: express.Response, _next: express.NextFunction) => {
      response.status(500).send(errorText(error));
    });
    const served = await serve(app);
    try {
      const strict = await send(served.url + '/strict');
      expect(strict.status).toBe(500);
      expect(strict.body).toContain('ERR_CONNECTION');
      expect(strict.body).not.toContain(KEY_MARKER);
      const open = await send(served.url + '/open');
      expect(open.status).toBe(200);
      expect(log.logged).toHaveLength(1);
      expect(log.logged[0]).toContain('error from store, allowing request');
      expect(log.logged[0]).not.toContain(KEY_MARKER);
    } finally {
      await served.close();
      await dead.close();
    }
  });

  it('names no key in a bad-input error', async () => {
    const store = expressStore({ prefix: 'p:' });
    store.init({ windowMs: 60_000 });
    const long = KEY_MARKER.repeat(100_000);
    expect((await rejection(store.increment(long))).constructor).toBe(RangeError);
    expect((await rejection(store.get(long))).constructor).toBe(RangeError);
  });
});

describe('two Express processes on one redis-server', () => {
  const children: ChildProcess[] = [];
  afterAll(() => {
    for (const child of children) child.stdin?.end();
  });

  /** Starts the fixture app; resolves its URL once it listens. */
  function start(prefix: string, limit: number): Promise<string> {
    const child = spawn(
      process.execPath,
      [join(__dirname, 'fixtures', 'express-app.js'), server.url, prefix, String(limit)],
      {
        stdio: ['pipe', 'pipe', 'inherit'],
      },
    );
    children.push(child);
    return new Promise((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`the app exited (${code}) before it listened`)));
      createInterface({ input: child.stdout! }).once('line', (port) => resolve(`http://127.0.0.1:${port}`));
    });
  }

  it('allows exactly `limit` requests in total', async () => {
    const prefix = `test:${randomUUID()}:`;
    const urls = await Promise.all([start(prefix, 7), start(prefix, 7)]);
    const replies = await Promise.all(Array.from({ length: 30 }, (_, i) => send(`${urls[i % 2]}/ok`)));
    const passed = replies.filter((r) => r.status === 200);
    expect(passed).toHaveLength(7);
    expect(replies.filter((r) => r.status === 429)).toHaveLength(23);
    const check = redis(prefix);
    expect((await check.hit('127.0.0.1', 60_000, 0)).count).toBe(30);
    for (const url of urls) expect(JSON.parse((await send(`${url}/logged`)).body)).toEqual([]);
  });

  it('share resets: resetKey in one process frees the client in the other', async () => {
    const prefix = `test:${randomUUID()}:`;
    const [a, b] = await Promise.all([start(prefix, 2), start(prefix, 2)]);
    const statuses = async (url: string, n: number) => {
      const out = [];
      for (let i = 0; i < n; i++) out.push((await send(`${url}/ok`)).status);
      return out;
    };
    expect([...(await statuses(a, 1)), ...(await statuses(b, 2))]).toEqual([200, 200, 429]);
    const adapter = expressStore({ store: redis(prefix) });
    adapter.init({ windowMs: 60_000 });
    await adapter.resetKey('127.0.0.1');
    expect(await statuses(b, 3)).toEqual([200, 200, 429]);
  });
});
