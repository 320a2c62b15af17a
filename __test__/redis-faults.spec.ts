// redisStore when things go wrong: each case starts its own redis-server
// (REDIS_URL never replaces these) and stops it by pid.
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { redisStore, type RedisStore } from '../index.js';
import { errorText, makeCertificates, runFixture, startRedis, type RedisServer } from './support/redis.js';

const KEY_MARKER = '198.51.100.23-key-marker';
const PASSWORD_MARKER = 'password-marker-77c1';
const TOKEN_MARKER = 'token-marker-0b9a';
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function server(options?: Parameters<typeof startRedis>[0]): Promise<RedisServer> {
  const started = await startRedis(options);
  cleanups.push(() => started.stop());
  return started;
}

function store(url: string, options: Parameters<typeof redisStore>[0] = {}): RedisStore {
  const made = redisStore({ url, prefix: `faults:${randomUUID()}:`, ...options });
  cleanups.push(() => made.close());
  return made;
}

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

/** The id of the one client connection that is not redis-cli's own. */
async function storeClientId(redis: RedisServer): Promise<string> {
  const clients = (await redis.cli('CLIENT', 'LIST')).split('\n').filter((line) => !/cmd=client\|list/.test(line));
  expect(clients).toHaveLength(1);
  return /id=(\d+)/.exec(clients[0])![1];
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
    expect(codes).toEqual(Array(3).fill('ERR_TIMEOUT'));
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
      .update(readFileSync(join(__dirname, '..', 'src', 'window.lua')))
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
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        proxy.close(() => resolve());
      }),
  );
  return {
    port: (proxy.address() as { port: number }).port,
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
