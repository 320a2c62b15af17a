// What the people running an app see: stats() counters moving on their
// events, the Prometheus exposition, onError, ping/connect, typed errors and
// close(). Every Redis case starts its own redis-server on 127.0.0.1.
import { describe, expect, it } from 'vitest';
import {
  closeStore,
  isRatestoreError,
  memoryStore,
  metricsText,
  redisStore,
  type ConnectionEvent,
  type RatestoreError,
  type RateLimitStore,
  type RedisStore,
} from '../index.js';
import { perCase } from './support/redis.js';

const KEY_MARKER = '198.51.100.77-key-marker';
const PASSWORD_MARKER = 'password-marker-5e21';
const HOUR = 3_600_000;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const { server, store, cleanups } = perCase('ops');

/** The code of a rejection, through the typed guard: compiled under tsc --strict by `npm run lint`. */
async function codeOf(call: Promise<unknown>): Promise<string> {
  try {
    await call;
  } catch (e: unknown) {
    if (isRatestoreError(e)) {
      switch (e.code) {
        case 'ERR_STORE_FULL':
        case 'ERR_CLOSED':
        case 'ERR_TIMEOUT':
        case 'ERR_CONNECTION':
          return e.code;
        default:
          return `other ${e.code}`;
      }
    }
    return 'not a ratestore error';
  }
  return 'resolved';
}

/**
 * A strict check of the Prometheus text format 0.0.4: every line a HELP, a TYPE or a sample; each
 * family's HELP and TYPE once, before its samples; names and labels well formed; counters end in
 * `_total`; values numbers; no sample twice.
 */
function checkExposition(text: string): Map<string, number> {
  expect(text.endsWith('\n')).toBe(true);
  const name = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const label = `[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"`;
  const sample = new RegExp(`^(${name})(\\{(?:${label}(?:,${label})*)?\\})? (-?[0-9.e+-]+|NaN|\\+Inf|-Inf)$`);
  const types = new Map<string, string>();
  const helped = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of text.slice(0, -1).split('\n')) {
    const meta = /^# (HELP|TYPE) (\S+) (.+)$/.exec(line);
    if (meta) {
      const [, kind, family, rest] = meta;
      expect(family).toMatch(new RegExp(`^${name}$`));
      if (kind === 'HELP') {
        expect(helped.has(family), `HELP ${family} twice`).toBe(false);
        helped.add(family);
      } else {
        expect(['counter', 'gauge', 'summary', 'histogram', 'untyped']).toContain(rest);
        expect(types.has(family), `TYPE ${family} twice`).toBe(false);
        if (rest === 'counter') expect(family).toMatch(/_total$/);
        types.set(family, rest);
      }
      continue;
    }
    const m = sample.exec(line);
    expect(m, `not a sample line: ${line}`).not.toBeNull();
    const [, metric, labels = '', value] = m!;
    const family = types.has(metric) ? metric : metric.replace(/_(sum|count)$/, '');
    expect(types.has(family), `${metric} has no TYPE before it`).toBe(true);
    expect(helped.has(family)).toBe(true);
    expect(Number.isNaN(Number(value)) && value !== 'NaN').toBe(false);
    const id = metric + labels;
    expect(seen.has(id), `${id} twice`).toBe(false);
    seen.set(id, Number(value));
  }
  return seen;
}

describe('memoryStore operations', () => {
  it('counts calls, refusals, evictions by reason and sweeps', async () => {
    const failures: unknown[] = [];
    const m = memoryStore({ maxKeys: 2, onError: (e) => failures.push(e) });
    cleanups.push(() => m.close());
    await m.hit('short', 60_000, 1);
    await m.hit('budget-1', 2 * HOUR, 1);
    await m.hit('budget-2', 2 * HOUR, 1); // evicts the short window
    expect(await codeOf(m.hit('budget-3', 2 * HOUR, 1))).toBe('ERR_STORE_FULL');
    await m.consume('budget-1', { limit: 5, windowMs: 2 * HOUR });
    const s = m.stats();
    expect(s).toMatchObject({
      kind: 'memory',
      calls: 5,
      refusals: 1,
      errors: { ERR_STORE_FULL: 1 },
      held: 2,
      capacity: 2,
      evictions: { ended: 0, short: 1 },
    });
    expect(failures.map((e) => (e as RatestoreError).code)).toEqual(['ERR_STORE_FULL']);
    const tiny = memoryStore({ maxKeys: 1 });
    cleanups.push(() => tiny.close());
    await tiny.hit('a', 1, 1);
    await sleep(5);
    await tiny.hit('b', 60_000, 1); // the ended window makes room
    expect(tiny.stats().evictions).toEqual({ ended: 1, short: 0 });
    await tiny.hit('c', 1, 1).catch(() => undefined);
    const before = tiny.stats().sweeps;
    await sleep(1_200);
    expect(tiny.stats().sweeps).toBeGreaterThan(before);
  });

  it('close() refuses later calls with ERR_CLOSED and settles every promise under concurrent hits', async () => {
    const m = memoryStore();
    const calls: Promise<unknown>[] = [];
    for (let i = 0; i < 200; i++) {
      calls.push(m.hit(`k${i % 7}`, 60_000, 1));
      if (i === 100) calls.push(m.close());
    }
    const settled = await Promise.allSettled(calls);
    expect(settled.filter((r) => r.status === 'fulfilled').length).toBe(102);
    const codes = settled.flatMap((r) => (r.status === 'rejected' ? [(r.reason as RatestoreError).code] : []));
    expect(new Set(codes)).toEqual(new Set(['ERR_CLOSED']));
    expect(await codeOf(m.consume('k', { limit: 1, windowMs: 1000 }))).toBe('ERR_CLOSED');
    await m.close(); // twice is fine
  });

  it('a named store is freed when its last holder closes, and kept by one collected unclosed', async () => {
    const name = `ops-${Math.random()}`;
    const a = memoryStore({ name, maxKeys: 10 });
    memoryStore({ name, maxKeys: 10 }); // never closed: keeps the table, as a reloaded module would
    await a.hit('k', 60_000, 3);
    expect(() => memoryStore({ name, maxKeys: 11 })).toThrow(
      expect.objectContaining({ code: 'ERR_STORE_NAME_CONFLICT' }),
    );
    await a.close();
    const b = memoryStore({ name, maxKeys: 10 });
    expect((await b.hit('k', 60_000, 0)).count).toBe(3);
    await b.close();

    const solo = `ops-solo-${Math.random()}`;
    const c = memoryStore({ name: solo, maxKeys: 10 });
    await c.hit('k', 60_000, 3);
    await closeStore(c);
    // Its last holder closed: the name is free, with a new table.
    const d = memoryStore({ name: solo, maxKeys: 20 });
    expect((await d.hit('k', 60_000, 0)).count).toBe(0);
    await d.close();
  });

  it('a missing windowMs is a TypeError wherever it is required', async () => {
    const m = memoryStore();
    cleanups.push(() => m.close());
    await expect(m.hit('k', undefined as unknown as number, 1)).rejects.toBeInstanceOf(TypeError);
    await expect(m.consume('k', { limit: 1 } as never)).rejects.toBeInstanceOf(TypeError);
    const { createLimiter } = await import('../index.js');
    expect(() => createLimiter({ store: m, limit: 1 } as never)).toThrow(TypeError);
  });
});

describe('redisStore operations', () => {
  it('ping() and connect() make one round trip; stats() counts calls, connects and latency', async () => {
    const redis = await server();
    const events: unknown[] = [];
    const r = store(redis.url, { onError: (e) => events.push(e) });
    await r.connect();
    expect(events).toEqual([{ type: 'connected' }]);
    await r.ping();
    for (let i = 0; i < 20; i++) await r.hit('k', 60_000, 1);
    const s = r.stats();
    expect(s).toMatchObject({ kind: 'redis', calls: 22, inFlight: 0, connects: 1, reconnects: 0, errors: {} });
    expect(s.latencyMs.count).toBe(22);
    expect(s.latencyMs.p50).toBeGreaterThan(0);
    expect(s.latencyMs.p50).toBeLessThanOrEqual(s.latencyMs.p99);
    expect(s.latencyMs.p99).toBeLessThanOrEqual(s.latencyMs.max);
    expect(Number.isSafeInteger(s.latencyMs.count)).toBe(true);
  });

  it('a killed server counts a loss and a reconnect, told to onError', async () => {
    const redis = await server();
    const seen: (RatestoreError | ConnectionEvent)[] = [];
    const r = store(redis.url, { onError: (e) => seen.push(e) });
    await r.hit('k', 60_000, 1);
    redis.signal('SIGKILL');
    await sleep(200);
    expect(await codeOf(r.hit('k', 60_000, 1))).toMatch(/ERR_CONNECTION|other/);
    await redis.restart();
    let ok = false;
    for (let i = 0; i < 100 && !ok; i++) {
      ok = await r.hit('k', 60_000, 1).then(
        () => true,
        () => false,
      );
      if (!ok) await sleep(100);
    }
    expect(ok).toBe(true);
    const s = r.stats();
    expect(s.reconnects).toBe(1);
    expect(s.connectionLosses).toBe(1);
    expect(s.connects).toBe(2);
    const types = seen.filter((e) => !(e instanceof Error)).map((e) => (e as ConnectionEvent).type);
    expect(types).toEqual(['connected', 'lost', 'reconnected']);
    expect(seen.find((e) => !(e instanceof Error) && e.type === 'lost')).toEqual({
      type: 'lost',
      code: 'ERR_CONNECTION',
    });
    // Every failed call was told once, with the error it rejected with.
    const told = seen.filter((e) => e instanceof Error).length;
    expect(Object.values(s.errors).reduce((a, b) => a + (b ?? 0), 0)).toBe(told);
  });

  it('a paused server counts a timeout', async () => {
    const redis = await server();
    const r = store(redis.url, { timeoutMs: 200 });
    await r.hit('k', 60_000, 1);
    redis.signal('SIGSTOP');
    try {
      expect(await codeOf(r.hit('k', 60_000, 1))).toBe('ERR_TIMEOUT');
    } finally {
      redis.signal('SIGCONT');
    }
    expect(r.stats().timeouts).toBe(1);
    expect(r.stats().errors).toEqual({ ERR_TIMEOUT: 1 });
  });

  it('a flushed script cache counts a NOSCRIPT reload', async () => {
    const redis = await server();
    const r = store(redis.url);
    await r.hit('k', 60_000, 1);
    // A fresh server has no script cached: the first hit loaded it.
    const loaded = r.stats().noscriptReloads;
    await r.hit('k', 60_000, 1);
    expect(r.stats().noscriptReloads).toBe(loaded);
    await redis.cli('SCRIPT', 'FLUSH');
    expect((await r.hit('k', 60_000, 1)).count).toBe(3);
    expect(r.stats().noscriptReloads).toBe(loaded + 1);
  });

  it('onError never sees a key marker or a password', async () => {
    const redis = await server({ password: PASSWORD_MARKER });
    const seen: unknown[] = [];
    const wrong = store(redis.url.replace(PASSWORD_MARKER, `${PASSWORD_MARKER}-wrong`), {
      onError: (e) => seen.push(e),
    });
    await wrong.hit(KEY_MARKER, 60_000, 1).catch(() => undefined);
    const good = store(redis.url, { onError: (e) => seen.push(e), timeoutMs: 300 });
    await good.hit(KEY_MARKER, 60_000, 1);
    await redis.cli('-a', PASSWORD_MARKER, 'SET', `x`, 'y').catch(() => undefined);
    redis.signal('SIGKILL');
    await sleep(200);
    await good.hit(KEY_MARKER, 60_000, 1).catch(() => undefined);
    await good.ping().catch(() => undefined);
    expect(seen.length).toBeGreaterThan(2);
    for (const e of seen) {
      const text = JSON.stringify(e, Object.getOwnPropertyNames(e as object)) + String(e);
      expect(text).not.toContain(KEY_MARKER);
      expect(text).not.toContain(PASSWORD_MARKER);
    }
    expect(seen.some((e) => isRatestoreError(e) && e.code === 'ERR_AUTH')).toBe(true);
  });

  it('close() under concurrent hits settles every promise', async () => {
    const redis = await server();
    const r = store(redis.url);
    await r.connect();
    const calls: Promise<unknown>[] = [];
    for (let i = 0; i < 300; i++) {
      calls.push(r.hit(`k${i % 11}`, 60_000, 1));
      if (i === 150) calls.push(r.close());
    }
    const settled = await Promise.allSettled(calls);
    expect(settled.length).toBe(301);
    const codes = new Set(settled.flatMap((s) => (s.status === 'rejected' ? [(s.reason as RatestoreError).code] : [])));
    expect([...codes]).toEqual(['ERR_CLOSED']);
  });
});

describe('metricsText', () => {
  it('is Prometheus text over several stores, each labelled by name', async () => {
    const redis = await server();
    const m = memoryStore({ maxKeys: 1 });
    cleanups.push(() => m.close());
    const r = store(redis.url);
    await m.hit('a', 2 * HOUR, 1);
    await m.hit('b', 2 * HOUR, 1).catch(() => undefined);
    await r.hit('a', 60_000, 1);
    const stores: Record<
      string,
      RateLimitStore & { stats(): ReturnType<RedisStore['stats']> | ReturnType<typeof m.stats> }
    > = {
      'api "memory"\n': m,
      redis: r,
    };
    const samples = checkExposition(metricsText(stores));
    expect(samples.get('ratestore_refusals_total{store="api \\"memory\\"\\n"}')).toBe(1);
    expect(samples.get('ratestore_errors_total{store="api \\"memory\\"\\n",code="ERR_STORE_FULL"}')).toBe(1);
    expect(samples.get('ratestore_calls_total{store="redis",kind="redis"}')).toBe(1);
    expect(samples.get('ratestore_call_latency_seconds_count{store="redis"}')).toBe(1);
    expect(samples.get('ratestore_call_latency_seconds{store="redis",quantile="0.99"}')).toBeGreaterThan(0);
    expect(metricsText({})).toBe('');
  });
});
