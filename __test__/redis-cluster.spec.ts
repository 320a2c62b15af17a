// redisStore on a real Redis Cluster: three masters with a replica each.
// The tests share one cluster and run in order: the failover test, which
// kills a master, comes last.
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  redisStore,
  type ConnectionEvent,
  type RatestoreError,
  type RedisStore,
  type RedisStoreOptions,
} from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite, redisOrderSuite } from './operations-suite.js';
import { slotOf, startCluster, type Cluster } from './support/cluster.js';
import { errorText, makeCertificates, startRedis } from './support/redis.js';

const KEY_MARKER = '198.51.100.23-cluster-key-marker';
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let cluster: Cluster;
beforeAll(async () => {
  cluster = await startCluster();
});
afterAll(() => cluster?.stop());

const prefix = `test:${randomUUID()}:`;
const stores: RedisStore[] = [];
afterAll(() => Promise.all(stores.map((store) => store.close())));
const make = (options: RedisStoreOptions = {}) => {
  const store = redisStore({ url: cluster.url, cluster: true, prefix, timeoutMs: 5_000, ...options });
  stores.push(store);
  return store;
};

rateLimitStoreContract('redisStore on a cluster', () => make());
limiterSuite('redisStore on a cluster', () => make());
operationsSuite('redisStore on a cluster', () => make());
redisOrderSuite('redisStore on a cluster', make, () =>
  Promise.all(cluster.nodes.map((node) => cluster.cli(node.port, 'SCRIPT', 'FLUSH'))),
);

/** The master port of each slot, as the first node sees it. */
async function slotMap(): Promise<number[]> {
  const ranges = JSON.parse(await cluster.cli(cluster.nodes[0].port, '--json', 'CLUSTER', 'SLOTS')) as [
    number,
    number,
    [string, number],
  ][];
  const map: number[] = [];
  for (const [start, end, [, port]] of ranges) for (let s = start; s <= end; s++) map[s] = Number(port);
  return map;
}

/** The keys, grouped by the master that holds them (with the store's prefix). */
async function byMaster(keys: string[]): Promise<Map<number, string[]>> {
  const map = await slotMap();
  const groups = new Map<number, string[]>();
  for (const key of keys) {
    const port = map[slotOf(prefix + key)];
    groups.set(port, [...(groups.get(port) ?? []), key]);
  }
  return groups;
}

describe('redisStore on a cluster', () => {
  it('counts 2,000 parallel hits over 1,000 keys on every master exactly', async () => {
    const store = make();
    const run = randomUUID();
    const keys = Array.from({ length: 1_000 }, (_, i) => `spread:${run}:${i}`);
    expect((await byMaster(keys)).size).toBe(3);
    const results = await Promise.all([...keys, ...keys].map((key) => store.hit(key, 60_000, 1)));
    for (let i = 0; i < keys.length; i++) {
      expect([results[i].count, results[i + keys.length].count].sort()).toEqual([1, 2]);
    }
    const reads = await Promise.all(keys.map((key) => store.hit(key, 60_000, 0)));
    expect(reads.every((r) => r.count === 2)).toBe(true);
  });

  it('reads REDIS_URL and REDIS_CLUSTER on the first hit; refuses several URLs without them', async () => {
    const saved = { url: process.env.REDIS_URL, cluster: process.env.REDIS_CLUSTER };
    const restore = () => {
      for (const [name, value] of [
        ['REDIS_URL', saved.url],
        ['REDIS_CLUSTER', saved.cluster],
      ] as const) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
    };
    try {
      const fromEnv = redisStore({ prefix });
      const single = redisStore({ prefix });
      stores.push(fromEnv, single);
      process.env.REDIS_URL = cluster.url;
      process.env.REDIS_CLUSTER = '1';
      expect((await fromEnv.hit(`env:${randomUUID()}`, 60_000, 3)).count).toBe(3);
      delete process.env.REDIS_CLUSTER;
      const error = await single.hit('k', 60_000, 1).then(
        () => undefined,
        (e: Error & { code: string }) => e,
      );
      expect(error?.code).toBe('ERR_CONFIG');
      expect(error?.message).toContain('REDIS_CLUSTER=1');
      expect(errorText(error)).not.toContain('127.0.0.1');
    } finally {
      restore();
    }
  });

  it('checks the option type, and says so when a server is not a cluster node', async () => {
    expect(() => redisStore({ cluster: 'yes' as unknown as boolean })).toThrow(TypeError);
    const plain = await startRedis();
    try {
      const store = redisStore({ url: plain.url, cluster: true });
      const error = await store.hit('k', 60_000, 1).then(
        () => undefined,
        (e: Error & { code: string }) => e,
      );
      expect(error?.code).toBe('ERR_REDIS');
      expect(error?.message).toContain('is this a Redis Cluster node?');
      await store.close();
    } finally {
      await plain.stop();
    }
  });

  it('learns the cluster from one live seed among dead ones, and close() refuses later hits', async () => {
    const dead = 'redis://127.0.0.1:1';
    const store = make({ url: `${dead},${cluster.url.split(',')[3]}` });
    const keys = Array.from({ length: 50 }, (_, i) => `seeded:${randomUUID()}:${i}`);
    const counts = await Promise.all(keys.map((key) => store.hit(key, 60_000, 2)));
    expect(counts.every((r) => r.count === 2)).toBe(true);
    await store.close();
    await expect(store.hit(keys[0], 60_000, 1)).rejects.toMatchObject({ code: 'ERR_CLOSED' });
  });

  it('loses and doubles no hit while slots migrate under load', { timeout: 60_000 }, async () => {
    const store = make();
    const run = randomUUID();
    const keys = Array.from({ length: 400 }, (_, i) => `migrate:${run}:${i}`);
    const before = await slotMap();
    const [from, to] = [...new Set(before)];
    const id = async (port: number) => cluster.cli(port, 'CLUSTER', 'MYID');
    const [fromId, toId] = await Promise.all([id(from), id(to)]);
    const sent = new Map(keys.map((key) => [key, 0]));
    const failures: unknown[] = [];
    let moving = true;
    const worker = async (w: number) => {
      for (let i = w; moving; i += 7) {
        const key = keys[i % keys.length];
        await store.hit(key, 60_000, 1).then(
          () => sent.set(key, sent.get(key)! + 1),
          (e: unknown) => failures.push(e),
        );
      }
    };
    const workers = Array.from({ length: 64 }, (_, w) => worker(w));
    await cluster.cli(
      from,
      '--cluster',
      'reshard',
      `127.0.0.1:${from}`,
      '--cluster-from',
      fromId,
      '--cluster-to',
      toId,
      '--cluster-slots',
      '600',
      '--cluster-yes',
    );
    moving = false;
    await Promise.all(workers);
    const after = await slotMap();
    const moved = keys.filter((key) => before[slotOf(prefix + key)] !== after[slotOf(prefix + key)]);
    expect(moved.length).toBeGreaterThan(0);
    expect(failures.map(errorText)).toEqual([]);
    const reads = await Promise.all(keys.map((key) => store.hit(key, 60_000, 0)));
    expect(Object.fromEntries(keys.map((key, i) => [key, reads[i].count]))).toEqual(Object.fromEntries(sent));
  });

  it('stats(): counts every node connection, one latency sample per hit, and a killed connection as a loss and a reconnect', async () => {
    const seen: (RatestoreError | ConnectionEvent)[] = [];
    // Settings of its own (timeoutMs), so that its connections and figures are its own.
    const store = make({ timeoutMs: 4_321, onError: (e) => seen.push(e) });
    const figures = () => {
      const { connects, reconnects, connectFailures, connectionLosses } = store.stats();
      return { connects, reconnects, connectFailures, connectionLosses };
    };
    const events = () => seen.filter((e) => !(e instanceof Error));
    expect(figures()).toEqual({ connects: 0, reconnects: 0, connectFailures: 0, connectionLosses: 0 });
    const run = randomUUID();
    const groups = await byMaster(Array.from({ length: 300 }, (_, i) => `stats:${KEY_MARKER}:${run}:${i}`));
    const masters = [...groups.keys()];
    expect(masters.length).toBe(3);
    const keys = masters.flatMap((port) => groups.get(port)!.slice(0, 5));
    await Promise.all(keys.map((key) => store.hit(key, 60_000, 1)));
    for (const key of keys) await store.hit(key, 60_000, 1);
    // One connection per master, and one to the seed the slot map came from if it is no master.
    const seed = Number(new URL(cluster.url.split(',')[0]).port);
    const opened = new Set([seed, ...masters]).size;
    expect(figures()).toEqual({ connects: opened, reconnects: 0, connectFailures: 0, connectionLosses: 0 });
    expect(events()).toEqual([{ type: 'connected' }]);
    expect(store.stats().latencyMs.count).toBe(2 * keys.length);

    // One sample per hit, not one per batch: 11 hits on live masters and 9 on a paused one, sent together
    // and interleaved, so that every batch but a lone hit holds both kinds; only the 9 take long. On a
    // store of its own, whose histogram holds these 20 samples only.
    const timed = make({ timeoutMs: 4_322 });
    // Connected to every master first: the 3 samples of these hits are quick too.
    await Promise.all(masters.map((port) => timed.hit(groups.get(port)![14], 60_000, 1)));
    const [slow, ...fast] = masters;
    const quick = fast.flatMap((port) => groups.get(port)!.slice(5, 11)).slice(0, 11);
    const paused = groups.get(slow)!.slice(5, 14);
    const together = quick.flatMap((key, i) => (i < paused.length ? [key, paused[i]] : [key]));
    cluster.signal(slow, 'SIGSTOP');
    let sent: Promise<unknown>;
    try {
      sent = Promise.all(together.map((key) => timed.hit(key, 60_000, 1)));
      await sleep(300);
    } finally {
      cluster.signal(slow, 'SIGCONT');
    }
    await sent;
    const latency = timed.stats().latencyMs;
    expect(latency.count).toBe(20 + masters.length);
    expect(latency.max).toBeGreaterThanOrEqual(250);
    // The median is the 12th of 23 samples: one of the 14 quick ones.
    expect(latency.p50).toBeLessThan(100);
    expect(latency.sumMs).toBeLessThan(12 * latency.max);

    // The connection to one master is killed while idle: a loss, then a reconnect on the next hit there.
    const victim = masters[1];
    await cluster.cli(victim, 'CLIENT', 'KILL', 'TYPE', 'normal');
    for (let i = 0; i < 100 && figures().connectionLosses === 0; i++) await sleep(20);
    expect(figures()).toEqual({ connects: opened, reconnects: 0, connectFailures: 0, connectionLosses: 1 });
    const counts = await Promise.all(
      groups
        .get(victim)!
        .slice(0, 5)
        .map((key) => store.hit(key, 60_000, 1)),
    );
    expect(counts.map((c) => c.count)).toEqual([3, 3, 3, 3, 3]);
    await sleep(50); // the events come with the next delivery
    expect(figures()).toEqual({ connects: opened + 1, reconnects: 1, connectFailures: 0, connectionLosses: 1 });
    expect(events()).toEqual([
      { type: 'connected' },
      { type: 'lost', code: 'ERR_CONNECTION' },
      { type: 'reconnected' },
    ]);
    expect(seen.filter((e) => e instanceof Error)).toEqual([]);
    expect(JSON.stringify(seen)).not.toContain(KEY_MARKER);
    expect(store.stats().latencyMs.count).toBe(2 * keys.length + 5);
  });

  it('rejects hits on a failed master until its replica takes over; the others keep counting', async () => {
    const seen: (RatestoreError | ConnectionEvent)[] = [];
    const store = make({ timeoutMs: 1_000, onError: (e) => seen.push(e) });
    const run = randomUUID();
    const groups = await byMaster(Array.from({ length: 300 }, (_, i) => `failover:${run}:${i}`));
    const [victim, ...others] = [...groups.keys()];
    const lost = groups.get(victim)!.slice(0, 20);
    const kept = others.flatMap((port) => groups.get(port)!.slice(0, 10));
    for (const key of [...lost, ...kept]) await store.hit(key, 60_000, 1);
    // The replica has the counts before its master dies.
    await cluster.cli(victim, 'WAIT', '1', '2000');
    cluster.kill(victim);
    let rounds = 0;
    let rejected = 0;
    let keptCount = 1;
    const keptWrong: unknown[] = [];
    await cluster.waitUntil(async () => {
      rounds++;
      // Keys on live masters count on, exactly, all along.
      const counts = await Promise.allSettled(kept.map((key) => store.hit(key, 60_000, 1)));
      keptCount++;
      keptWrong.push(...counts.filter((r) => r.status === 'rejected' || r.value.count !== keptCount));
      const results = await Promise.allSettled(lost.map((key) => store.hit(key, 60_000, 0)));
      for (const result of results) {
        if (result.status === 'rejected') {
          rejected++;
          expect(['ERR_CONNECTION', 'ERR_TIMEOUT', 'ERR_REDIS']).toContain(result.reason.code);
          expect(errorText(result.reason)).not.toContain(run);
        }
      }
      return results.every((r) => r.status === 'fulfilled');
    }, 'hits on the failed master keys succeed again');
    expect(keptWrong).toEqual([]);
    expect(rejected).toBeGreaterThan(0);
    expect(rounds).toBeGreaterThan(1);
    const counts = await Promise.all(lost.map((key) => store.hit(key, 60_000, 1)));
    expect(counts.every((r) => r.count === 2)).toBe(true);
    // The killed master's connection was lost; the one to its promoted replica replaced it.
    const s = store.stats();
    expect(s.connectionLosses).toBe(1);
    expect(s.reconnects).toBe(1);
    expect(s.connectFailures).toBeGreaterThan(0);
    const events = seen.filter((e) => !(e instanceof Error));
    expect(events).toEqual([{ type: 'connected' }, { type: 'lost', code: 'ERR_CONNECTION' }, { type: 'reconnected' }]);
    // Every failed hit was told once, with the error it rejected with.
    expect(seen.filter((e) => e instanceof Error).length).toBe(rejected);
  });
});

describe('redisStore on a TLS cluster', () => {
  it('reaches every master over rediss:// with tls.ca, and refuses nodes it does not trust', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ratestore-tls-cluster-'));
    try {
      const files = await makeCertificates(dir);
      const tlsCluster = await startCluster({ tls: files });
      try {
        const store = redisStore({
          url: tlsCluster.url,
          cluster: true,
          prefix,
          tls: { ca: readFileSync(files.ca, 'utf8') },
        });
        const keys = Array.from({ length: 100 }, (_, i) => `tls:${randomUUID()}:${i}`);
        const results = await Promise.all([...keys, ...keys].map((key) => store.hit(key, 60_000, 1)));
        expect(results.filter((r) => r.count === 2)).toHaveLength(keys.length);
        await store.close();
        const untrusted = redisStore({ url: tlsCluster.url, cluster: true });
        const error = await untrusted.hit('k', 60_000, 1).then(
          () => undefined,
          (e: Error & { code: string }) => e,
        );
        expect(error?.code).toBe('ERR_CONNECTION');
        expect(error?.message).toMatch(/certificate/i);
      } finally {
        await tlsCluster.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
