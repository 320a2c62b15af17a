// redisStore when things go wrong: each case starts its own redis-server
// (REDIS_URL never replaces these) and stops it by pid.
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { redisStore, type RedisStore } from '../index.js';
import { interleavingProxy, listenOnLoopback, overtakenPair, slowingProxy } from './support/proxy.js';
import {
  errorText,
  freePort,
  makeCertificates,
  perCase,
  rejection as rejectionOf,
  runFixture,
  type RedisServer,
} from './support/redis.js';

const KEY_MARKER = '198.51.100.23-key-marker';
const PASSWORD_MARKER = 'password-marker-77c1';
const TOKEN_MARKER = 'token-marker-0b9a';
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const { server, store, cleanups } = perCase('faults');

/** What a hit settles with: a count, or the code of its error (which must hold no secret). */
async function outcome(pending: Promise<{ count: number }>): Promise<number | string> {
  try {
    return (await pending).count;
  } catch (error) {
    const text = errorText(error);
    for (const secret of [KEY_MARKER, PASSWORD_MARKER, TOKEN_MARKER]) expect(text).not.toContain(secret);
    return (error as { code: string }).code;
  }
}

/** Hits until one succeeds, for at most `ms`; answers the outcomes seen. */
async function untilCounted(s: RedisStore, ms: number): Promise<(number | string)[]> {
  const seen: (number | string)[] = [];
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    seen.push(await outcome(s.hit(KEY_MARKER, 60_000, 1)));
    if (typeof seen.at(-1) === 'number') break;
    await sleep(20);
  }
  return seen;
}

async function commandCalls(redis: RedisServer, command: string): Promise<number> {
  const stats = await redis.cli('INFO', 'commandstats');
  return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
}

/** Counts the connections the server accepts from now on, leaving out those of the redis-cli calls that ask. */
async function connectionCounter(redis: RedisServer): Promise<() => Promise<number>> {
  const total = async () => Number(/total_connections_received:(\d+)/.exec(await redis.cli('INFO', 'stats'))![1]);
  const start = await total();
  let asked = 0;
  return async () => (await total()) - start - ++asked;
}

/** Hits at `perSecond` (in groups every 10 ms) for `ms`; answers every error (and count) they settle with. */
async function paced(s: RedisStore, perSecond: number, ms: number): Promise<unknown[]> {
  const pending: Promise<unknown>[] = [];
  const started = performance.now();
  for (let tick = 1; tick * 10 <= ms; tick++) {
    for (let i = 0; i < perSecond / 100; i++) {
      pending.push(
        s.hit(KEY_MARKER, 60_000, 1).then(
          (hit) => hit.count,
          (error: unknown) => error,
        ),
      );
    }
    await sleep(started + tick * 10 - performance.now());
  }
  return Promise.all(pending);
}

/** The ids of the client connections that are not redis-cli's own. */
async function storeClientIds(redis: RedisServer): Promise<string[]> {
  const clients = (await redis.cli('CLIENT', 'LIST')).split('\n').filter((line) => !/cmd=client\|list/.test(line));
  return clients.map((line) => /id=(\d+)/.exec(line)![1]);
}

/** The id of the one client connection that is not redis-cli's own. */
async function storeClientId(redis: RedisServer): Promise<string> {
  const ids = await storeClientIds(redis);
  expect(ids).toHaveLength(1);
  return ids[0];
}

describe('redisStore faults', () => {
  it('rejects every hit while the server is killed, and counts again once it is back on the same port', async () => {
    const redis = await server();
    const s = store(redis.url, { timeoutMs: 1_000 });
    let down = false;
    let countedWhileDown = 0;
    const codes = new Set<string>();
    let stop = false;
    const worker = async (id: number) => {
      while (!stop) {
        const wasDown = down;
        const result = await outcome(s.hit(`${KEY_MARKER}:${id}`, 60_000, 1));
        if (typeof result === 'string') {
          codes.add(result);
          await sleep(5);
        } else if (wasDown && down) {
          countedWhileDown++;
        }
      }
    };
    const workers = Array.from({ length: 16 }, (_, id) => worker(id));
    await sleep(300);
    redis.signal('SIGKILL');
    await sleep(50);
    down = true;
    await sleep(300);
    down = false;
    await redis.restart();
    const afterRestart = await untilCounted(s, 5_000);
    stop = true;
    await Promise.all(workers);
    expect(countedWhileDown).toBe(0);
    expect([...codes].every((code) => code === 'ERR_CONNECTION' || code === 'ERR_TIMEOUT')).toBe(true);
    expect(codes.has('ERR_CONNECTION')).toBe(true);
    expect(typeof afterRestart.at(-1)).toBe('number');
  });

  it('notices a connection that closed while idle: the first hit after a restart counts', async () => {
    const redis = await server();
    const s = store(redis.url);
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
    redis.signal('SIGKILL');
    await redis.restart();
    await sleep(50);
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
  });

  it('times out on a paused server within timeoutMs, and recovers after it resumes', async () => {
    const redis = await server();
    const s = store(redis.url, { timeoutMs: 300 });
    expect(await outcome(s.hit(KEY_MARKER, 60_000, 1))).toBe(1);
    redis.signal('SIGSTOP');
    try {
      const started = performance.now();
      expect(await outcome(s.hit(KEY_MARKER, 60_000, 1))).toBe('ERR_TIMEOUT');
      const elapsed = performance.now() - started;
      expect(elapsed).toBeGreaterThanOrEqual(250);
      expect(elapsed).toBeLessThan(2_000);
    } finally {
      redis.signal('SIGCONT');
    }
    // The timed-out hit reached the server and counted once it resumed: it was never sent again.
    const seen = await untilCounted(s, 5_000);
    expect(seen.at(-1)).toBe(3);
  });

  it('replaces a connection after a run of timeouts alone', async () => {
    const redis = await server();
    const s = store(redis.url, { timeoutMs: 200 });
    await s.hit('k', 60_000, 1);
    const before = await storeClientId(redis);
    redis.signal('SIGSTOP');
    try {
      // The third timeout closes the connection: a hit still on it may reject with ERR_CONNECTION instead.
      const codes = await Promise.all(Array.from({ length: 4 }, () => outcome(s.hit('k', 60_000, 1))));
      expect(codes.filter((code) => code === 'ERR_TIMEOUT').length).toBeGreaterThanOrEqual(3);
      expect(codes.every((code) => code === 'ERR_TIMEOUT' || code === 'ERR_CONNECTION')).toBe(true);
    } finally {
      redis.signal('SIGCONT');
    }
    expect(typeof (await untilCounted(s, 5_000)).at(-1)).toBe('number');
    expect(await storeClientId(redis)).not.toBe(before);
  });

  it('replaces a connection that stops answering while the server is fine (a half-open socket)', async () => {
    const redis = await server();
    const proxy = await freezingProxy(redis.port);
    const s = store(`redis://127.0.0.1:${proxy.port}`, { timeoutMs: 200 });
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
    proxy.freeze();
    const codes = await Promise.all(Array.from({ length: 3 }, () => outcome(s.hit('k', 60_000, 1))));
    // As on a paused server: the third timeout closes the connection, so a hit whose deadline came in
    // the same timer tick may reject with ERR_CONNECTION instead.
    expect(codes.filter((code) => code === 'ERR_TIMEOUT').length).toBeGreaterThanOrEqual(2);
    expect(codes.every((code) => code === 'ERR_TIMEOUT' || code === 'ERR_CONNECTION')).toBe(true);
    // The frozen socket never answers again; a fresh connection does.
    const seen = await untilCounted(s, 5_000);
    expect(typeof seen.at(-1)).toBe('number');
    expect(proxy.connections()).toBeGreaterThanOrEqual(2);
  });

  it('keeps a process alive while a hit is in flight on a paused server, until it times out', async () => {
    const redis = await server();
    redis.signal('SIGSTOP');
    try {
      const script = join(__dirname, 'fixtures', 'redis-exits.js');
      expect(await runFixture(script, ['in-flight', redis.url])).toBe('rejected ERR_TIMEOUT');
    } finally {
      redis.signal('SIGCONT');
    }
  });

  it('opens one connection for concurrent first hits, and keeps using it', async () => {
    const redis = await server();
    const s = store(redis.url);
    // Hits in waves across turns of the event loop, so that several batches wait on the connect.
    const first: Promise<unknown>[] = [];
    for (let wave = 0; wave < 20; wave++) {
      for (let i = 0; i < 10; i++) first.push(s.hit(`k${i % 3}`, 60_000, 1));
      await new Promise((resolve) => setImmediate(resolve));
    }
    expect(await Promise.all(first)).toHaveLength(200);
    const id = await storeClientId(redis);
    await Promise.all(Array.from({ length: 200 }, (_, i) => s.hit(`k${i % 3}`, 60_000, 1)));
    expect(await storeClientId(redis)).toBe(id);
  });

  it('sends EVAL after a script flush, once, then EVALSHA again', async () => {
    const redis = await server();
    const s = store(redis.url);
    const sha = createHash('sha1')
      .update(readFileSync(join(__dirname, '..', 'src', 'redis', 'lua', 'window.lua')))
      .digest('hex');
    expect(await s.hit('k', 60_000, 1)).toMatchObject({ count: 1 });
    expect(await redis.cli('SCRIPT', 'EXISTS', sha)).toBe('1');
    await redis.cli('SCRIPT', 'FLUSH');
    const [evalsha, evals] = [await commandCalls(redis, 'evalsha'), await commandCalls(redis, 'eval')];
    expect(await s.hit('k', 60_000, 1)).toMatchObject({ count: 2 });
    expect(await s.hit('k', 60_000, 1)).toMatchObject({ count: 3 });
    expect(await commandCalls(redis, 'evalsha')).toBe(evalsha + 2);
    expect(await commandCalls(redis, 'eval')).toBe(evals + 1);
  });

  it('rejects with ERR_AUTH for a wrong or missing password, and takes the token from options or REDIS_TOKEN', async () => {
    const password = `right-${randomUUID()}`;
    const redis = await server({ password });
    const host = `127.0.0.1:${redis.port}`;
    expect(await outcome(store(`redis://:${PASSWORD_MARKER}@${host}`).hit(KEY_MARKER, 1000, 1))).toBe('ERR_AUTH');
    expect(await outcome(store(`redis://${host}`).hit(KEY_MARKER, 1000, 1))).toBe('ERR_AUTH');
    expect(await outcome(store(`redis://${host}`, { token: TOKEN_MARKER }).hit(KEY_MARKER, 1000, 1))).toBe('ERR_AUTH');
    // The token wins over a password in the URL.
    expect(await outcome(store(`redis://:${PASSWORD_MARKER}@${host}`, { token: password }).hit('k', 1000, 1))).toBe(1);
    const saved = process.env.REDIS_TOKEN;
    process.env.REDIS_TOKEN = password;
    try {
      expect(await outcome(store(`redis://${host}`).hit('k', 1000, 1))).toBe(1);
    } finally {
      if (saved === undefined) delete process.env.REDIS_TOKEN;
      else process.env.REDIS_TOKEN = saved;
    }
  });

  it('reaches a TLS server through rediss:// and tls.ca, and refuses one it does not trust', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ratestore-tls-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const files = await makeCertificates(dir);
    const redis = await server({ tls: files });
    const ca = readFileSync(files.ca, 'utf8');
    const s = store(redis.url, { tls: { ca } });
    const counts = await Promise.all(Array.from({ length: 10 }, () => outcome(s.hit('k', 60_000, 1))));
    expect(counts.sort((a, b) => Number(a) - Number(b))).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    const untrusted = await store(redis.url)
      .hit(KEY_MARKER, 60_000, 1)
      .catch((e: Error & { code: string }) => e);
    expect((untrusted as { code: string }).code).toBe('ERR_CONNECTION');
    expect((untrusted as Error).message).toMatch(/certificate/i);
  });
});

/** What each error of `settled` says: its code and whether it was sent. No secret in any. */
function errorsOf(settled: unknown[]): Set<string> {
  const seen = new Set<string>();
  for (const result of settled) {
    if (typeof result === 'number') {
      seen.add('counted');
      continue;
    }
    const text = errorText(result);
    for (const secret of [KEY_MARKER, PASSWORD_MARKER, TOKEN_MARKER]) expect(text).not.toContain(secret);
    const { code, sent } = result as { code: string; sent?: boolean };
    seen.add(`${code} sent=${sent}`);
  }
  return seen;
}

describe('redisStore under faults: backoff, demotions, stalls, sharing', () => {
  it('backs off behind an endpoint that closes every connection, and counts soon after it answers', async () => {
    const redis = await server();
    const endpoint = await closingEndpoint(redis.port);
    const s = store(`redis://127.0.0.1:${endpoint.port}`, { timeoutMs: 1_000 });
    const settled = await paced(s, 2_000, 2_000);
    expect(settled).toHaveLength(4_000);
    expect(endpoint.accepted()).toBeGreaterThanOrEqual(2);
    expect(endpoint.accepted()).toBeLessThan(30);
    expect(errorsOf(settled)).toEqual(new Set(['ERR_CONNECTION sent=false']));
    expect(settled.some((e) => /backing off/.test((e as Error).message))).toBe(true);
    endpoint.answer();
    const started = performance.now();
    const seen = await untilCounted(s, 8_000);
    expect(typeof seen.at(-1)).toBe('number');
    // At most one backoff window (5 s at most) after the endpoint answers.
    expect(performance.now() - started).toBeLessThan(5_500);
  });

  it('backs off after a wrong password, and counts soon after the server takes it', async () => {
    const redis = await server({ password: `right-${randomUUID()}` });
    const opened = await connectionCounter(redis);
    const s = store(`redis://:${PASSWORD_MARKER}@127.0.0.1:${redis.port}`, { timeoutMs: 1_000 });
    const settled = await paced(s, 2_000, 2_000);
    const attempts = await opened();
    expect(attempts).toBeGreaterThanOrEqual(2);
    expect(attempts).toBeLessThan(30);
    expect(errorsOf(settled)).toEqual(new Set(['ERR_AUTH sent=undefined']));
    expect(settled.some((e) => /backing off/.test((e as Error).message))).toBe(true);
    await redis.cli('CONFIG', 'SET', 'requirepass', PASSWORD_MARKER);
    const started = performance.now();
    expect(typeof (await untilCounted(s, 8_000)).at(-1)).toBe('number');
    expect(performance.now() - started).toBeLessThan(5_500);
  });

  it('leaves a primary that was demoted to a replica, on a new connection', async () => {
    const primary = await server();
    const other = await server();
    const s = store(primary.url, { timeoutMs: 1_000 });
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
    const before = await storeClientId(primary);
    await primary.cli('REPLICAOF', '127.0.0.1', String(other.port));
    const refused = await s.hit('k', 60_000, 1).catch((e: Error & { code: string }) => e);
    expect((refused as { code: string }).code).toBe('ERR_REDIS');
    expect((refused as Error).message).toMatch(/READONLY/);
    const meanwhile = await Promise.all(Array.from({ length: 20 }, () => outcome(s.hit('k', 60_000, 1))));
    expect(meanwhile.every((code) => code === 'ERR_REDIS')).toBe(true);
    await primary.cli('REPLICAOF', 'NO', 'ONE');
    expect(typeof (await untilCounted(s, 5_000)).at(-1)).toBe('number');
    expect(await storeClientId(primary)).not.toBe(before);
  });

  it('replaces a silent connection after one timeout when hits come one at a time', async () => {
    const redis = await server();
    const proxy = await freezingProxy(redis.port);
    const s = store(`redis://127.0.0.1:${proxy.port}`, { timeoutMs: 300 });
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
    proxy.freeze();
    expect(await outcome(s.hit('k', 60_000, 1))).toBe('ERR_TIMEOUT');
    // The frozen hit never reached the server; the next one counts, on a new connection.
    expect(await outcome(s.hit('k', 60_000, 1))).toBe(2);
    expect(proxy.connections()).toBe(2);
  });

  it('says whether a hit that failed was sent', async () => {
    const redis = await server();
    const silent = await closingEndpoint(redis.port, { silent: true });
    const connecting = await store(`redis://127.0.0.1:${silent.port}`, { timeoutMs: 300 })
      .hit(KEY_MARKER, 60_000, 1)
      .catch((e: unknown) => e);
    expect(connecting).toMatchObject({ code: 'ERR_TIMEOUT', sent: false });
    expect(Object.getOwnPropertyNames(connecting)).toContain('sent');
    expect((connecting as Error).message).toMatch(/not sent, so it did not count/);
    const refused = await store(`redis://127.0.0.1:${await freePort()}`)
      .hit(KEY_MARKER, 60_000, 1)
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: 'ERR_CONNECTION', sent: false });
    const s = store(redis.url, { timeoutMs: 300 });
    expect(await outcome(s.hit(KEY_MARKER, 60_000, 1))).toBe(1);
    redis.signal('SIGSTOP');
    try {
      const sent = await s.hit(KEY_MARKER, 60_000, 1).catch((e: unknown) => e);
      expect(sent).toMatchObject({ code: 'ERR_TIMEOUT', sent: true });
      expect((sent as Error).message).toMatch(/may or may not have counted/);
    } finally {
      redis.signal('SIGCONT');
    }
    for (const error of [connecting, refused]) expect(errorText(error)).not.toContain(KEY_MARKER);
  });

  it('shares one connection among stores with the same settings', async () => {
    const redis = await server();
    const opened = await connectionCounter(redis);
    const stores = Array.from({ length: 200 }, (_, i) => store(redis.url, { prefix: `per-request:${i}:` }));
    for (const s of stores) expect(await outcome(s.hit('k', 60_000, 1))).toBe(1);
    expect(await opened()).toBe(1);
    const [shared] = await storeClientIds(redis);
    // Other settings (here timeoutMs), another connection; closing a store leaves the shared one open.
    expect(await outcome(store(redis.url, { timeoutMs: 1_234 }).hit('k', 60_000, 1))).toBe(1);
    await stores[0].close();
    expect(await outcome(stores[1].hit('k', 60_000, 1))).toBe(2);
    expect(await storeClientIds(redis)).toHaveLength(2);
    expect(await storeClientIds(redis)).toContain(shared);
  });

  it('keeps the connection of a store made per request and collected, for the next one', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const redis = await server();
    const opened = await connectionCounter(redis);
    const prefix = `collected:${randomUUID()}:`;
    for (let i = 0; i < 200; i++) {
      // Never closed: each store is collected (its connection let go) soon after its hit.
      const hit = await redisStore({ url: redis.url, prefix }).hit('k', 60_000, 1);
      expect(hit.count).toBe(i + 1);
      if (i % 20 === 19) {
        gc();
        await sleep(10);
      }
    }
    expect(await opened()).toBe(1);
  });
});

/**
 * A loopback endpoint that accepts every connection and closes it at once (or, `silent`, keeps it and never
 * answers), counting them; after `answer()` it forwards new connections to the server at `target`.
 */
async function closingEndpoint(
  target: number,
  options: { silent?: boolean } = {},
): Promise<{ port: number; accepted(): number; answer(): void }> {
  let accepted = 0;
  let answering = false;
  const sockets: Socket[] = [];
  const endpoint: Server = createServer((client) => {
    accepted++;
    sockets.push(client);
    client.on('error', () => client.destroy());
    if (!answering) {
      if (!options.silent) client.destroy();
      return;
    }
    const upstream = connect(target, '127.0.0.1');
    sockets.push(upstream);
    upstream.on('error', () => client.destroy());
    client.pipe(upstream);
    upstream.pipe(client);
  });
  const port = await listenOnLoopback(endpoint, sockets, cleanups);
  return {
    port,
    accepted: () => accepted,
    answer: () => (answering = true),
  };
}

/** A loopback TCP proxy whose `freeze()` makes every open connection go silent, as a half-open socket does. */
async function freezingProxy(target: number): Promise<{ port: number; freeze(): void; connections(): number }> {
  const sockets: Socket[] = [];
  let live: [Socket, Socket][] = [];
  const proxy: Server = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    client.pipe(upstream);
    upstream.pipe(client);
    for (const socket of [client, upstream]) socket.on('error', () => [client, upstream].forEach((s) => s.destroy()));
    sockets.push(client, upstream);
    live.push([client, upstream]);
  });
  const port = await listenOnLoopback(proxy, sockets, cleanups);
  return {
    port,
    freeze() {
      for (const [client, upstream] of live) {
        client.unpipe(upstream);
        upstream.unpipe(client);
        client.pause();
        upstream.pause();
      }
      live = [];
    },
    connections: () => sockets.length / 2,
  };
}

// On Node.js one server is served on the event loop; elsewhere (Bun, Deno) on the I/O thread, which
// Node.js runs too when the runtime says so: the rule must hold on both.
const requireCjs = createRequire(__filename);
const { runtime } = requireCjs('../lib/runtime.js') as { runtime: { eventLoop: boolean } };

/** A store on the event loop or on the I/O thread (a store takes its transport when it is made). */
function storeOn(eventLoop: boolean, url: string, options?: Parameters<typeof redisStore>[0]): RedisStore {
  const before = runtime.eventLoop;
  runtime.eventLoop = eventLoop;
  try {
    return store(url, options);
  } finally {
    runtime.eventLoop = before;
  }
}

describe.each([
  ['the event loop', true],
  ['the I/O thread', false],
])('redisStore on %s: a connection that answers other hits meanwhile', (_, eventLoop) => {
  it('is kept through two timeouts in a row, and replaced after three', async () => {
    const redis = await server();
    const proxy = await slowingProxy(redis.port, (key) => (key.includes('slow') ? 600 : 100), cleanups);
    const s = storeOn(eventLoop, `redis://127.0.0.1:${proxy.port}`, { timeoutMs: 300 });
    // Warm: every script the rounds use is loaded, so each hit is one command.
    expect(await outcome(s.hit('fast', 60_000, 1))).toBe(1);
    expect(await outcome(s.hit('slow:0', 60_000, 1))).toBe(1);
    proxy.slow();
    // Each round: a hit answered in time (after the slow ones were sent), then slow ones that time out.
    const round = async (slow: number) => {
      const fast = outcome(s.hit('fast', 60_000, 1));
      // Written before the slow ones, on the I/O thread too (whose pipeline answers a batch at once).
      await sleep(20);
      // Keys of their own: no slow hit waits for another on its key.
      const slows = Array.from({ length: slow }, (_, i) => outcome(s.hit(`slow:${i}`, 60_000, 1)));
      return [await fast, ...(await Promise.all(slows))];
    };
    for (let i = 0; i < 3; i++) {
      const [fast, ...slows] = await round(2);
      expect(typeof fast).toBe('number');
      expect(slows).toEqual(['ERR_TIMEOUT', 'ERR_TIMEOUT']);
      // The late replies come in before the next round.
      await sleep(400);
    }
    expect(proxy.connections()).toBe(1);
    const [fast, ...slows] = await round(3);
    expect(typeof fast).toBe('number');
    expect(slows).toEqual(['ERR_TIMEOUT', 'ERR_TIMEOUT', 'ERR_TIMEOUT']);
    expect(typeof (await outcome(s.hit('fast', 60_000, 1)))).toBe('number');
    expect(proxy.connections()).toBe(2);
  });
});

describe.each([
  ['the event loop', true],
  ['the I/O thread', false],
])('redisStore on %s: another client loads a script between two calls after SCRIPT FLUSH', (_, eventLoop) => {
  it('the earlier call, which met NOSCRIPT, rejects unsent and never runs after the later one', async () => {
    const redis = await server();
    const proxy = await interleavingProxy(redis.port, cleanups);
    const s = storeOn(eventLoop, `redis://127.0.0.1:${proxy.port}`);
    // The window script's first use goes as EVAL: the proxy sees its body.
    expect(await outcome(s.hit('warm', 60_000, 1))).toBe(1);
    const { first, second, after } = await overtakenPair(s, proxy, (...a) => redis.cli(...a), randomUUID);
    expect(second).toBe(2);
    expect(first).toMatchObject({ code: 'ERR_REDIS', sent: false });
    expect((first as { message: string }).message).toMatch(/did not run \(nothing was counted\)/);
    // It never ran: the count is the second call's alone, and the store goes on.
    expect(after).toBe(2);
    expect(await outcome(s.hit('warm', 60_000, 1))).toBe(2);
  });
});

describe.each([
  ['the event loop', true],
  ['the I/O thread', false],
])('redisStore on %s with waitForReplicas and too few replicas', (_, eventLoop) => {
  it('under load, rejects every call unconfirmed (sent) before timeoutMs, on the one connection', async () => {
    const redis = await server();
    const connections = await connectionCounter(redis);
    // At Redis's default hz 10 a WAIT answers up to 100 ms after its time: a call written behind one waits
    // for it, then for its own, and timeoutMs must leave room for both.
    const timeoutMs = 1_000;
    // No replica: every WAIT answers 0 after its time, blocking the connection on the server meanwhile.
    const s = storeOn(eventLoop, redis.url, { timeoutMs, waitForReplicas: 1 });
    let calls = 0;
    let slowest = 0;
    const seen: string[] = [];
    const pending: Promise<void>[] = [];
    const call = async () => {
      const started = performance.now();
      calls++;
      const error = await rejectionOf(s.hit(KEY_MARKER, 60_000, 1), [KEY_MARKER]);
      slowest = Math.max(slowest, performance.now() - started);
      seen.push(`${error.code} ${error.sent} ${/only 0 of the 1 replicas/.test(error.message)}`);
    };
    // Two calls every 10 ms for 2.5 s: calls arrive on many ticks while a WAIT is out.
    const begun = performance.now();
    for (let tick = 1; tick <= 250; tick++) {
      pending.push(call(), call());
      await sleep(begun + tick * 10 - performance.now());
    }
    await Promise.all(pending);
    expect(new Set(seen)).toEqual(new Set(['ERR_REDIS true true']));
    expect(slowest).toBeLessThan(timeoutMs);
    expect(await connections()).toBe(1);
    // Each ran on the master (so each says sent: true), once.
    const keys = (await redis.cli('--scan', '--pattern', '*')).split('\n');
    expect(Number(await redis.cli('GET', keys[0]))).toBe(calls);
    const stats = s.stats();
    expect([stats.unconfirmed, stats.timeouts, stats.connectionLosses]).toEqual([calls, 0, 0]);
  });

  it('on a master demoted to a replica, which refuses WAIT, rejects a call that wrote nothing, sent, and reconnects', async () => {
    const primary = await server();
    const other = await server();
    const s = storeOn(eventLoop, primary.url, { timeoutMs: 1_000, waitForReplicas: 1 });
    // No replica yet: the ping ran, and is unconfirmed.
    const unconfirmed = await rejectionOf(s.ping(), []);
    expect([unconfirmed.code, unconfirmed.sent]).toEqual(['ERR_REDIS', true]);
    const first = await storeClientId(primary);
    await primary.cli('REPLICAOF', '127.0.0.1', String(other.port));
    // A PING runs on a replica; the WAIT after it is refused.
    const refused = await rejectionOf(s.ping(), []);
    expect([refused.code, refused.sent]).toEqual(['ERR_REDIS', true]);
    expect(refused.message).toMatch(/refused the WAIT .*replica instances/);
    // The store backs off from the demoted server: the calls it refuses meanwhile were not sent, and do
    // not say they were (the refused WAIT's sent: true is not the backoff's).
    const backingOff = await rejectionOf(s.ping(), []);
    expect(backingOff.message).toMatch(/it was demoted.*backing off .*unsent/);
    expect([backingOff.code, backingOff.sent]).toEqual(['ERR_REDIS', undefined]);
    await primary.cli('REPLICAOF', 'NO', 'ONE');
    // The demoted server's connection was dropped: the next call that reaches it is on a new one.
    const deadline = Date.now() + 5_000;
    let reached = false;
    while (!reached && Date.now() < deadline) {
      const error = await rejectionOf(s.ping(), []);
      reached = /only 0 of the 1/.test(error.message);
      if (!reached) await sleep(50);
    }
    expect(reached).toBe(true);
    expect(await storeClientId(primary)).not.toBe(first);
  });

  it('rejects, sent, naming the permission, when the ACL user may not run WAIT', async () => {
    const redis = await server();
    await redis.cli('ACL', 'SETUSER', 'app', 'on', `>${PASSWORD_MARKER}`, '~*', '+@all', '-wait');
    const s = storeOn(eventLoop, `redis://app:${PASSWORD_MARKER}@127.0.0.1:${redis.port}`, { waitForReplicas: 1 });
    const error = await rejectionOf(s.hit(KEY_MARKER, 60_000, 1), [KEY_MARKER, PASSWORD_MARKER]);
    expect([error.code, error.sent]).toEqual(['ERR_REDIS', true]);
    expect(error.message).toMatch(/refused the WAIT .*NOPERM.*needs the wait command \(\+wait\)/);
    expect(s.stats().unconfirmed).toBe(1);
  });
});
