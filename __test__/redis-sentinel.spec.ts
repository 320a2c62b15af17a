// redisStore through Redis Sentinel: a primary, a replica and three sentinels, each a real
// redis-server on a free loopback port, started per transport and stopped by pid; plain, and over
// TLS only (rediss+sentinel://, nothing listening in plaintext).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore, type RedisStore } from '../index.js';
import { errorText, freePort, makeCertificates, redisCli, rejection } from './support/redis.js';

const MASTER_PASSWORD = 'master-password-marker-5d2e';
const SENTINEL_PASSWORD = 'sentinel-password-marker-91f0';
/** An ACL user of the sentinels' own, beside their default user's requirepass. */
const SENTINEL_USER = 'watcher';
const SENTINEL_USER_PASSWORD = 'sentinel-acl-password-marker-7c41';
const KEY_MARKER = '198.51.100.77-key-marker';
const SECRETS = [MASTER_PASSWORD, SENTINEL_PASSWORD, SENTINEL_USER_PASSWORD, KEY_MARKER];
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const requireCjs = createRequire(__filename);
const { runtime } = requireCjs('../lib/runtime.js') as { runtime: { eventLoop: boolean } };

type TlsFiles = Awaited<ReturnType<typeof makeCertificates>>;

interface Topology {
  sentinels: number[];
  /** The URL with every sentinel and both passwords (rediss+sentinel:// over TLS). */
  url: string;
  /** The same, reaching the sentinels as their ACL user. */
  aclUrl: string;
  cli(port: number, ...args: string[]): Promise<string>;
  /** The master's port as the first sentinel names it. */
  master(): Promise<number>;
  /**
   * Resolves once every sentinel names one master, with no failover under way, and that master has its
   * replica in sync (after a failover: once the old master has rejoined as the replica).
   */
  healthy(): Promise<void>;
  stop(): Promise<void>;
}

async function ready(port: number, password: string, tlsArgs: string[]): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const answer = await redisCli([...tlsArgs, '-p', String(port), '-a', password, 'PING']).catch(() => '');
    if (answer === 'PONG') return;
    if (Date.now() > deadline) throw new Error(`the server on port ${port} did not start`);
    await sleep(50);
  }
}

/**
 * The topology; with `tls`, every server (sentinels included) listens on a TLS port only, with the
 * certificate of `tls` (IP SAN 127.0.0.1), and replicates and monitors over TLS.
 */
async function startTopology(tls?: TlsFiles): Promise<Topology> {
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-sentinel-'));
  const children: ChildProcess[] = [];
  const run = (args: string[]) => {
    const child = spawn('redis-server', args, { stdio: 'ignore' });
    children.push(child);
    return child;
  };
  // A replica's full sync writes an RDB file whatever --save says: keep it in the topology's own folder.
  const common = ['--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no', '--dir', dir];
  // A replica that (re)joins syncs at once, not after the default 5 s wait for more replicas.
  common.push('--repl-diskless-sync-delay', '0');
  const auth = ['--requirepass', MASTER_PASSWORD, '--masterauth', MASTER_PASSWORD];
  // The TLS settings, as `name value` pairs: for the servers' flags and the sentinels' files alike.
  const tlsSettings = tls
    ? [
        ['tls-cert-file', tls.cert],
        ['tls-key-file', tls.key],
        ['tls-ca-cert-file', tls.ca],
        ['tls-auth-clients', 'no'],
        ['tls-replication', 'yes'],
      ]
    : [];
  const listen = (port: number) =>
    tls
      ? ['--port', '0', '--tls-port', String(port), ...tlsSettings.flatMap(([k, v]) => [`--${k}`, v])]
      : ['--port', String(port)];
  const tlsArgs = tls ? ['--tls', '--cacert', tls.ca] : [];
  const primary = await freePort();
  run([...common, ...auth, ...listen(primary)]);
  await ready(primary, MASTER_PASSWORD, tlsArgs);
  const replica = await freePort();
  run([...common, ...auth, ...listen(replica), '--replicaof', '127.0.0.1', String(primary)]);
  await ready(replica, MASTER_PASSWORD, tlsArgs);
  const sentinels: number[] = [];
  for (let i = 0; i < 3; i++) {
    const port = await freePort();
    const conf = join(dir, `sentinel-${port}.conf`);
    writeFileSync(
      conf,
      [
        ...(tls ? ['port 0', `tls-port ${port}`, ...tlsSettings.map(([k, v]) => `${k} ${v}`)] : [`port ${port}`]),
        'bind 127.0.0.1',
        'protected-mode no',
        `requirepass ${SENTINEL_PASSWORD}`,
        // Everything a client of the sentinels needs, +switch-master's channel included.
        `user ${SENTINEL_USER} on >${SENTINEL_USER_PASSWORD} ~* &* +@all`,
        `sentinel monitor m 127.0.0.1 ${primary} 2`,
        `sentinel auth-pass m ${MASTER_PASSWORD}`,
        'sentinel down-after-milliseconds m 1000',
        'sentinel failover-timeout m 5000',
        '',
      ].join('\n'),
    );
    run([conf, '--sentinel']);
    sentinels.push(port);
  }
  const cli = (port: number, ...args: string[]) =>
    redisCli([
      ...tlsArgs,
      '-p',
      String(port),
      '-a',
      sentinels.includes(port) ? SENTINEL_PASSWORD : MASTER_PASSWORD,
      ...args,
    ]);
  for (const port of sentinels) await ready(port, SENTINEL_PASSWORD, tlsArgs);
  // Ready once the replica is in sync and every sentinel knows the replica and the other sentinels.
  const deadline = Date.now() + 30_000;
  for (;;) {
    const link = await cli(replica, 'INFO', 'replication');
    const known = await Promise.all(
      sentinels.map(async (port) => {
        const master = await cli(port, 'SENTINEL', 'MASTER', 'm');
        const lines = master.split('\n');
        const field = (name: string) => Number(lines[lines.indexOf(name) + 1]);
        return field('num-slaves') === 1 && field('num-other-sentinels') === 2;
      }),
    );
    if (link.includes('master_link_status:up') && known.every(Boolean)) break;
    if (Date.now() > deadline) throw new Error('the sentinels did not find the replica and each other');
    await sleep(200);
  }
  const hosts = sentinels.map((port) => `127.0.0.1:${port}`).join(',');
  return {
    sentinels,
    url: `${tls ? 'rediss' : 'redis'}+sentinel://:${MASTER_PASSWORD}@${hosts}/m?sentinelPassword=${SENTINEL_PASSWORD}`,
    aclUrl: `${tls ? 'rediss' : 'redis'}+sentinel://:${MASTER_PASSWORD}@${hosts}/m?sentinelUsername=${SENTINEL_USER}&sentinelPassword=${SENTINEL_USER_PASSWORD}`,
    cli,
    async master() {
      const answer = await cli(sentinels[0], 'SENTINEL', 'get-master-addr-by-name', 'm');
      return Number(answer.split('\n')[1]);
    },
    async healthy() {
      const until = Date.now() + 30_000;
      for (;;) {
        const views = await Promise.all(
          sentinels.map(async (port) => {
            const lines = (await cli(port, 'SENTINEL', 'MASTER', 'm')).split('\n');
            const field = (name: string) => lines[lines.indexOf(name) + 1];
            return `${field('port')} ${field('flags')}`;
          }),
        );
        const port = Number(views[0].split(' ')[0]);
        const agreed = views.every((view) => view === `${port} master`);
        const info = agreed ? await cli(port, 'INFO', 'replication').catch(() => '') : '';
        const replica = /slave0:ip=[^,]+,port=(\d+),state=online/.exec(info);
        const link = replica ? await cli(Number(replica[1]), 'INFO', 'replication').catch(() => '') : '';
        if (/^role:master/m.test(info) && link.includes('master_link_status:up')) return;
        if (Date.now() > until) throw new Error(`the topology did not settle: ${views.join('; ')}`);
        await sleep(200);
      }
    },
    async stop() {
      await Promise.all(
        children.map(
          (child) =>
            new Promise<void>((resolve) => {
              if (child.exitCode !== null || child.signalCode !== null) return resolve();
              child.once('exit', () => resolve());
              child.kill('SIGKILL');
            }),
        ),
      );
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A TCP server that accepts connections and never answers. */
async function silentServer(): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

type StoreOptions = Omit<Parameters<typeof redisStore>[0] & object, 'url'>;

/** Makes stores on one transport, each under a prefix of its own unless given one; `closeAll` closes them. */
function storesOn(eventLoop: boolean): {
  store(url: string, options?: StoreOptions): RedisStore;
  closeAll(): Promise<void>;
} {
  const stores: RedisStore[] = [];
  return {
    store(url, options = {}) {
      const before = runtime.eventLoop;
      runtime.eventLoop = eventLoop;
      try {
        const made = redisStore({ url, prefix: `sentinel:${randomUUID()}:`, ...options });
        stores.push(made);
        return made;
      } finally {
        runtime.eventLoop = before;
      }
    },
    async closeAll() {
      for (const s of stores.splice(0)) await s.close();
    },
  };
}

/**
 * Whether a client of a sentinel is subscribed (a store listening for +switch-master), as `user` if
 * given.
 */
async function listened(topology: Topology, user?: string): Promise<boolean> {
  const lists = await Promise.all(topology.sentinels.map((port) => topology.cli(port, 'CLIENT', 'LIST')));
  return lists.some((list) =>
    list.split('\n').some((client) => /\bsub=[1-9]/.test(client) && (!user || client.includes(` user=${user} `))),
  );
}

/** Three hits count 1, 2, 3 on the master the sentinels name, and the replica receives the counts. */
async function countsOnTheMaster(topology: Topology, s: RedisStore, prefix: string): Promise<void> {
  await topology.healthy();
  for (let i = 1; i <= 3; i++) expect((await s.hit(KEY_MARKER, 60_000, 1)).count).toBe(i);
  const master = await topology.master();
  expect(await topology.cli(master, 'ROLE')).toMatch(/^master/);
  const replica = Number(/port=(\d+)/.exec(await topology.cli(master, 'INFO', 'replication'))![1]);
  await topology.cli(master, 'WAIT', '1', '2000');
  const onMaster = await topology.cli(master, '--scan', '--pattern', `${prefix}*`);
  const onReplica = await topology.cli(replica, '--scan', '--pattern', `${prefix}*`);
  expect(onMaster).not.toBe('');
  expect(onReplica).toBe(onMaster);
}

/** redisStore's rejection of a call that ran on the master but too few replicas confirmed. */
const UNCONFIRMED = /replicas that waitForReplicas asks for confirmed it/;

/**
 * The count of `failover`, read (a hit of 0). With waitForReplicas a read waits for a replica too, and
 * Sentinel may be moving the replica (the old master, turned replica after a failover, syncing from the
 * new one; a sentinel fixing a replica's configuration) while the topology looks settled: a read no
 * replica confirmed rejects, ERR_REDIS, and is asked again, up to 10 s. Nothing else is retried.
 */
async function readCount(s: RedisStore, fenced: boolean): Promise<number> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      return (await s.hit('failover', 600_000, 0)).count;
    } catch (error) {
      const unconfirmed = UNCONFIRMED.test(errorText(error));
      if (!fenced || !unconfirmed || Date.now() > deadline) throw error;
      await sleep(100);
    }
  }
}

/**
 * A failover test's own time: `followsFailover` loops for up to 25 s (with waitForReplicas the replica
 * resyncs for most of it), after a wait of up to 3 s for the store's subscription; on a loaded machine
 * the whole needs more than the suites' 30 s.
 */
const FAILOVER_TIMEOUT_MS = 60_000;

/**
 * `SENTINEL FAILOVER` under a loop of hits on `s` (made with timeoutMs 1000 and `prefix`): none counted
 * twice, each counted once on the new master, and hits succeed again within a few seconds. `fenced`
 * (`waitForReplicas: 1`): none lost either, every count a hit answered is on the new master.
 */
async function followsFailover(topology: Topology, s: RedisStore, prefix: string, fenced = false): Promise<void> {
  await topology.healthy();
  const old = await topology.master();
  // A replica confirms before the first hit, which must count once. With waitForReplicas, a replica
  // Sentinel is still moving may not confirm the hit itself: it ran on the master all the same (sent),
  // so its count is read back.
  expect(await readCount(s, fenced)).toBe(0);
  const first = await s.hit('failover', 600_000, 1).then(
    (answer) => answer.count,
    (error) => {
      if (!fenced || !UNCONFIRMED.test(errorText(error))) throw error;
      return readCount(s, fenced);
    },
  );
  expect(first).toBe(1);
  if (process.platform === 'linux') expect(watchers()).toBeGreaterThan(0);
  // The store listens for +switch-master on a sentinel (over TLS when the sentinels serve only TLS).
  const subscribed = Date.now() + 3_000;
  while (!(await listened(topology)) && Date.now() < subscribed) await sleep(50);
  expect(await listened(topology), 'a sentinel has a subscriber').toBe(true);
  const counts = [1];
  let failures = 0;
  let sentFailures = 0;
  let failedAt: number | undefined;
  let lastFailure = 0;
  let failedOver: number | undefined;
  let moved = 0;
  const deadline = Date.now() + 25_000;
  const start = Date.now();
  let asked = false;
  while (Date.now() < deadline) {
    if (!asked && Date.now() - start > 300) {
      asked = true;
      expect(await topology.cli(topology.sentinels[1], 'SENTINEL', 'FAILOVER', 'm')).toBe('OK');
    }
    try {
      counts.push((await s.hit('failover', 600_000, 1)).count);
    } catch (error) {
      const text = errorText(error);
      for (const secret of SECRETS) expect(text).not.toContain(secret);
      expect(['ERR_CONNECTION', 'ERR_TIMEOUT', 'ERR_REDIS']).toContain((error as { code: string }).code);
      failures++;
      if ((error as { sent?: boolean }).sent !== false) sentFailures++;
      failedAt ??= Date.now();
      lastFailure = Date.now();
      await sleep(20);
    }
    if (failedOver === undefined && asked && (await topology.master()) !== old) failedOver = Date.now();
    if (failedOver !== undefined && Date.now() - failedOver > 1_500 && Date.now() - lastFailure > 1_000) {
      if (++moved >= 20) break;
    }
  }
  expect(failedOver, 'the sentinels failed over').toBeDefined();
  const master = await topology.master();
  expect(master).not.toBe(old);
  expect(await topology.cli(master, 'ROLE')).toMatch(/^master/);
  // No hit was counted twice: the n-th successful hit never answered more than n, plus the hits that
  // failed after being sent (which may have counted).
  counts.forEach((count, i) => expect(count).toBeLessThanOrEqual(i + 1 + sentFailures));
  // With the fence, no count a hit answered was lost: the n-th successful hit answered at least n, the
  // hits before it all being on whichever master answered it.
  if (fenced)
    counts.forEach((count, i) => expect(count, `hit ${i + 1} of ${counts.length}`).toBeGreaterThanOrEqual(i + 1));
  // On the new master every hit counts once: the answers after the move rise by one each.
  const after = counts.slice(-20);
  after.forEach((count, i) => expect(count).toBe(after[0] + i));
  // The store reads from the new master, where the counter is.
  const final = await readCount(s, fenced);
  expect(final).toBe(counts.at(-1));
  const stored = (await topology.cli(master, '--scan', '--pattern', `${prefix}*`)).split('\n');
  expect(stored.length).toBe(1);
  expect(Number(await topology.cli(master, 'GET', stored[0]))).toBe(final);
  // Hits succeeded again within a few seconds of the first failure; with the fence, once the new master
  // has a replica again (the old master, once the sentinels have made it one and it has synced).
  if (failedAt !== undefined) expect(lastFailure - failedAt).toBeLessThan(fenced ? 20_000 : 5_000);
}

describe.each([
  ['the event loop', true],
  ['the I/O thread', false],
])('redisStore through Redis Sentinel on %s', (_, eventLoop) => {
  let topology: Topology;
  const { store, closeAll } = storesOn(eventLoop);
  beforeAll(async () => {
    topology = await startTopology();
  });
  afterAll(async () => {
    await closeAll();
    await topology?.stop();
  });

  it('counts on the master the sentinels name, and the replica receives the counts', async () => {
    const prefix = `sentinel:${randomUUID()}:`;
    await countsOnTheMaster(topology, store(topology.url, { prefix }), prefix);
  });

  it(
    'follows SENTINEL FAILOVER under a loop of hits: none counted twice, each counted once on the new master',
    async () => {
      const prefix = `sentinel:${randomUUID()}:`;
      await followsFailover(topology, store(topology.url, { timeoutMs: 1_000, prefix }), prefix);
    },
    FAILOVER_TIMEOUT_MS,
  );

  it(
    'with waitForReplicas, follows SENTINEL FAILOVER under a loop of hits and loses no count a hit answered',
    async () => {
      const prefix = `sentinel:${randomUUID()}:`;
      const s = store(topology.url, { timeoutMs: 1_000, prefix, waitForReplicas: 1 });
      await followsFailover(topology, s, prefix, true);
    },
    FAILOVER_TIMEOUT_MS,
  );

  it('with waitForReplicas, answers once the replica has the count, and rejects, sent, what too few replicas confirm', async () => {
    const prefix = `sentinel:${randomUUID()}:`;
    await topology.healthy();
    const s = store(topology.url, { prefix, waitForReplicas: 1 });
    const master = await topology.master();
    const replica = Number(/port=(\d+)/.exec(await topology.cli(master, 'INFO', 'replication'))![1]);
    for (let i = 1; i <= 3; i++) {
      expect((await s.hit(KEY_MARKER, 60_000, 1)).count).toBe(i);
      // Answered only once the replica had it: no WAIT of the test's own.
      const keys = (await topology.cli(replica, '--scan', '--pattern', `${prefix}*`)).split('\n');
      expect(keys.length).toBe(1);
      expect(Number(await topology.cli(replica, 'GET', keys[0]))).toBe(i);
    }
    // Two replicas asked for, one there: the hit ran on the master but is not answered.
    const two = store(topology.url, { prefix, waitForReplicas: 2, timeoutMs: 600 });
    const started = Date.now();
    const error = await rejection(two.hit(KEY_MARKER, 60_000, 1), SECRETS);
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(Date.now() - started).toBeLessThan(600);
    expect(error.code).toBe('ERR_REDIS');
    expect(error.sent).toBe(true);
    expect(error.message).toMatch(/only 1 of the 2 replicas that waitForReplicas asks for confirmed it within 300 ms/);
    // reset(key) and ping() wait for the replicas too; resetAll() does not.
    // Both awaited at once: either may reject first.
    for (const refused of await Promise.all([
      rejection(two.reset(KEY_MARKER), SECRETS),
      rejection(two.ping(), SECRETS),
    ]))
      expect([refused.code, refused.sent]).toEqual(['ERR_REDIS', true]);
    expect((await s.hit(KEY_MARKER, 60_000, 0)).count).toBe(0);
    await two.resetAll();
  });

  it('runs reset and resetAll on the master', async () => {
    const s = store(topology.url);
    await s.hit('a', 60_000, 2);
    await s.hit('b', 60_000, 3);
    await s.reset('a');
    expect((await s.hit('a', 60_000, 0)).count).toBe(0);
    await s.resetAll();
    expect((await s.hit('b', 60_000, 0)).count).toBe(0);
  });

  it('rejects a master name the sentinels do not know with ERR_CONFIG', async () => {
    const url = topology.url.replace('/m?', '/no-such-master?');
    const error = await rejection(store(url).hit(KEY_MARKER, 60_000, 1), SECRETS);
    expect(error.code).toBe('ERR_CONFIG');
    expect(error.message).toMatch(/the sentinels know no master of the name in the URL/);
  });

  it('asks the sentinels as their ACL user (sentinelUsername), and listens for failovers as it', async () => {
    const s = store(topology.aclUrl);
    for (let i = 1; i <= 3; i++) expect((await s.hit(KEY_MARKER, 60_000, 1)).count).toBe(i);
    const deadline = Date.now() + 3_000;
    while (!(await listened(topology, SENTINEL_USER)) && Date.now() < deadline) await sleep(50);
    expect(await listened(topology, SENTINEL_USER), 'subscribed as the ACL user').toBe(true);
    // The user's password is not the default user's: a wrong user name is refused.
    const url = topology.aclUrl.replace(`sentinelUsername=${SENTINEL_USER}`, 'sentinelUsername=nobody');
    const error = await rejection(store(url).hit(KEY_MARKER, 60_000, 1), SECRETS);
    expect(error.code).toBe('ERR_AUTH');
    expect(error.message).toMatch(/sentinel/);
  });

  it('rejects a wrong sentinelPassword with ERR_AUTH', async () => {
    const url = topology.url.replace(`sentinelPassword=${SENTINEL_PASSWORD}`, 'sentinelPassword=wrong-marker-3a');
    const error = await rejection(store(url).hit(KEY_MARKER, 60_000, 1), [...SECRETS, 'wrong-marker-3a']);
    expect(error.code).toBe('ERR_AUTH');
    expect(error.message).toMatch(/sentinel/);
  });

  it('rejects a wrong master password with ERR_AUTH', async () => {
    const url = topology.url.replace(MASTER_PASSWORD, 'wrong-marker-3b');
    const error = await rejection(store(url).hit(KEY_MARKER, 60_000, 1), [...SECRETS, 'wrong-marker-3b']);
    expect(error.code).toBe('ERR_AUTH');
  });

  it('asks the next sentinel when the first is down', async () => {
    const down = await freePort();
    const url = topology.url.replace('@', `@127.0.0.1:${down},`);
    expect((await store(url).hit(KEY_MARKER, 60_000, 1)).count).toBe(1);
  });

  it('rejects unreachable or silent sentinels within timeoutMs', async () => {
    const silent = await silentServer();
    try {
      const down = await freePort();
      for (const hosts of [
        `127.0.0.1:${down}`,
        `127.0.0.1:${silent.port}`,
        `127.0.0.1:${down},127.0.0.1:${silent.port}`,
      ]) {
        const started = Date.now();
        const error = await rejection(
          store(`redis+sentinel://:${MASTER_PASSWORD}@${hosts}/m`, { timeoutMs: 400 }).hit(KEY_MARKER, 60_000, 1),
          SECRETS,
        );
        expect(Date.now() - started).toBeLessThan(1_200);
        expect(['ERR_CONNECTION', 'ERR_TIMEOUT']).toContain(error.code);
        expect(error.sent).toBe(false);
        expect(error.message).toMatch(/sentinel|timed out|within/i);
      }
    } finally {
      await silent.close();
    }
  });
});

describe.each([
  ['the event loop', true],
  ['the I/O thread', false],
])('redisStore through Redis Sentinel over TLS (rediss+sentinel://) on %s', (_, eventLoop) => {
  let topology: Topology;
  let dir: string;
  let ca: string;
  let otherCa: string;
  const { store, closeAll } = storesOn(eventLoop);
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ratestore-sentinel-tls-'));
    mkdirSync(join(dir, 'other'));
    const files = await makeCertificates(dir);
    ca = readFileSync(files.ca, 'utf8');
    otherCa = readFileSync((await makeCertificates(join(dir, 'other'))).ca, 'utf8');
    topology = await startTopology(files);
  });
  afterAll(async () => {
    await closeAll();
    await topology?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('counts over TLS to the sentinels and to the master, trusting tls.ca', async () => {
    const prefix = `sentinel:${randomUUID()}:`;
    await countsOnTheMaster(topology, store(topology.url, { prefix, tls: { ca } }), prefix);
  });

  it('rejects sentinels whose certificate it does not trust with ERR_CONNECTION, naming no secret', async () => {
    for (const options of [{ tls: { ca: otherCa } }, {}]) {
      const started = Date.now();
      const error = await rejection(
        store(topology.url, { ...options, timeoutMs: 500 }).hit(KEY_MARKER, 60_000, 1),
        SECRETS,
      );
      expect(Date.now() - started).toBeLessThan(1_500);
      expect(error.code).toBe('ERR_CONNECTION');
      expect(error.sent).toBe(false);
      expect(error.message).toMatch(/sentinel.*certificate/i);
    }
  });

  it(
    'follows SENTINEL FAILOVER under a loop of hits over TLS',
    async () => {
      const prefix = `sentinel:${randomUUID()}:`;
      await followsFailover(topology, store(topology.url, { timeoutMs: 1_000, prefix, tls: { ca } }), prefix);
    },
    FAILOVER_TIMEOUT_MS,
  );
});

describe('redisStore through Redis Sentinel over TLS: host names', () => {
  let topology: Topology;
  let dir: string;
  let ca: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ratestore-sentinel-names-'));
    const files = await makeCertificates(dir, { ip: false });
    ca = readFileSync(files.ca, 'utf8');
    topology = await startTopology(files);
  });
  afterAll(async () => {
    await topology?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("checks the sentinels by the URL's host and the master by the address the sentinels give, on both transports", async () => {
    // The certificates name localhost only; the sentinels give the master as 127.0.0.1.
    for (const eventLoop of [true, false]) {
      const { store, closeAll } = storesOn(eventLoop);
      try {
        const byName = topology.url.replaceAll('127.0.0.1', 'localhost');
        const master = await rejection(
          store(byName, { tls: { ca }, timeoutMs: 500 }).hit(KEY_MARKER, 60_000, 1),
          SECRETS,
        );
        expect(master.code).toBe('ERR_CONNECTION');
        expect(master.message).toMatch(/not valid for name "127\.0\.0\.1".*with the master/);
        const sentinel = await rejection(
          store(topology.url, { tls: { ca }, timeoutMs: 500 }).hit(KEY_MARKER, 60_000, 1),
          SECRETS,
        );
        expect(sentinel.code).toBe('ERR_CONNECTION');
        expect(sentinel.message).toMatch(/could not reach any sentinel.*not valid for name/);
      } finally {
        await closeAll();
      }
    }
  });
});

/** The threads of this process that listen to sentinels (Linux only; -1 elsewhere). */
function watchers(): number {
  if (process.platform !== 'linux') return -1;
  return readdirSync('/proc/self/task').filter((task) => {
    try {
      return readFileSync(`/proc/self/task/${task}/comm`, 'utf8').startsWith('ratestore-senti');
    } catch {
      return false;
    }
  }).length;
}

describe('redisStore Sentinel URLs', () => {
  it.runIf(process.platform === 'linux')('stops listening to the sentinels once the stores are closed', async () => {
    const deadline = Date.now() + 5_000;
    while (watchers() > 0 && Date.now() < deadline) await sleep(100);
    expect(watchers()).toBe(0);
  });

  it('refuses the cluster setting, tls.ca without TLS, malformed URLs and waitForReplicas off one server with ERR_CONFIG, naming no secret', async () => {
    for (const [options, expected] of [
      [
        { url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1/m`, tls: { ca: 'x' } },
        /not a rediss:\/\/, rediss\+sentinel:\/\//,
      ],
      [{ url: `rediss+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1/m`, tls: { ca: 'x' } }, /PEM certificate/],
      [{ url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1/m`, cluster: true }, /not Redis Cluster nodes/],
      [{ url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1` }, /names no master/],
      [
        { url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1/m?db=2` },
        /only the sentinelUsername and sentinelPassword/,
      ],
      [
        { url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1/m?sentinelUsername=u` },
        /its password as sentinelPassword/,
      ],
      [{ url: `redis+sentinel://:${MASTER_PASSWORD}@127.0.0.1:1,,127.0.0.1:2/m` }, /not host\[:port\]/],
      [
        { url: `redis://:${MASTER_PASSWORD}@127.0.0.1:1,redis://127.0.0.1:2`, cluster: true, waitForReplicas: 1 },
        /waitForReplicas is for one server or a Sentinel-watched master/,
      ],
      [{ url: 'http://127.0.0.1:1', token: MASTER_PASSWORD, waitForReplicas: 1 }, /not a Redis Cluster nor Upstash/],
    ] as const) {
      const s = redisStore(options);
      const error = await rejection(s.hit(KEY_MARKER, 60_000, 1), SECRETS);
      await s.close();
      expect(error.code, String(expected)).toBe('ERR_CONFIG');
      expect(error.message).toMatch(expected);
    }
  });
});
