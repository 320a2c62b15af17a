'use strict';
// A real Redis Cluster on loopback for the tests and the benchmark: six
// redis-server processes (three masters with one replica each), each in a
// temporary directory of its own for nodes.conf, joined by
// `redis-cli --cluster create`. Every process is stopped by pid, on stop()
// and on exit, even when starting failed half-way.

const { execFile, spawn } = require('node:child_process');
const { mkdtempSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const { freePort, retryPortTaken } = require('./free-port.js');

const INSTALL =
  'redis-server and redis-cli were not found on PATH. The cluster tests run a real Redis Cluster: install Redis 7 ' +
  'with `apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS).';

const running = new Set();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/** Runs redis-cli; resolves its output, trimmed. */
function cli(args, timeout = 30_000) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['--no-auth-warning', ...args], { timeout }, (error, stdout, stderr) => {
      if (error?.code === 'ENOENT') reject(new Error(INSTALL));
      else if (error) reject(new Error(`redis-cli ${args.join(' ')} failed: ${stderr || error.message}\n${stdout}`));
      else resolve(stdout.trim());
    });
  });
}

function launch(port, busPort, dir, tls) {
  const args = ['--cluster-port', String(busPort), '--bind', '127.0.0.1'];
  if (tls) {
    args.push('--port', '0', '--tls-port', String(port), '--tls-cluster', 'yes', '--tls-replication', 'yes');
    args.push('--tls-cert-file', tls.cert, '--tls-key-file', tls.key, '--tls-ca-cert-file', tls.ca);
    args.push('--tls-auth-clients', 'no');
  } else {
    args.push('--port', String(port));
  }
  args.push('--protected-mode', 'no', '--save', '', '--appendonly', 'no', '--dir', dir);
  args.push('--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '1000');
  // As managed clusters are usually set: a failed master's slots don't stop the others' (README, "Redis Cluster").
  args.push('--cluster-require-full-coverage', 'no');
  return new Promise((resolve, reject) => {
    const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    running.add(child);
    child.once('exit', () => running.delete(child));
    let output = '';
    const timer = setTimeout(() => fail(new Error(`redis-server did not start on port ${port}:\n${output}`)), 10_000);
    function fail(error) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(error);
    }
    child.once('error', (error) => fail(error.code === 'ENOENT' ? new Error(INSTALL) : error));
    child.once('exit', (code) => fail(new Error(`redis-server exited (${code}) on port ${port}:\n${output}`)));
    child.stderr.on('data', (chunk) => (output += chunk));
    child.stdout.on('data', (chunk) => {
      output += chunk;
      if (output.includes('Ready to accept connections')) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        child.once('exit', () => running.delete(child));
        child.stdout.removeAllListeners('data');
        child.stdout.resume();
        resolve(child);
      }
    });
  });
}

/** Parses `INFO`/`CLUSTER INFO` output into an object. */
function fields(text) {
  return Object.fromEntries(
    text
      .split(/\r?\n/)
      .filter((line) => line.includes(':'))
      .map((line) => [line.slice(0, line.indexOf(':')), line.slice(line.indexOf(':') + 1).trim()]),
  );
}

/** Starts a cluster as `startOnce` does, on new ports when a node lost its port before its bind. */
function startCluster(options = {}) {
  return retryPortTaken(() => startOnce(options));
}

/**
 * Starts a cluster of `masters` masters with one replica each; with `tls`
 * ({ cert, key, ca }: PEM files), every port and the cluster bus speak TLS only. Resolves
 * { url (the seed URLs, comma-separated), nodes: [{ port, pid }], cli(port, ...args),
 * kill(port), signal(port, signal), masterOf(slot), waitUntil(check, what), stop() }.
 */
async function startOnce({ masters = 3, tls } = {}) {
  const tlsArgs = tls ? ['--tls', '--cacert', tls.ca] : [];
  const run = (port, ...args) => cli([...tlsArgs, '-p', String(port), ...args]);
  const nodes = [];
  const dirs = [];
  const stop = async () => {
    await Promise.all(
      nodes.map(({ child }) => {
        if (child.exitCode !== null || child.signalCode !== null) return undefined;
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGKILL');
        return exited;
      }),
    );
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  };
  try {
    const ports = [];
    while (ports.length < masters * 4) {
      const port = await freePort();
      if (!ports.includes(port)) ports.push(port);
    }
    await Promise.all(
      ports.slice(0, masters * 2).map(async (port, i) => {
        const dir = mkdtempSync(join(tmpdir(), 'ratestore-cluster-'));
        dirs.push(dir);
        const child = await launch(port, ports[masters * 2 + i], dir, tls);
        nodes.push({ port, child });
      }),
    );
    const all = ports.slice(0, masters * 2).map((port) => `127.0.0.1:${port}`);
    await cli([...tlsArgs, '--cluster', 'create', ...all, '--cluster-replicas', '1', '--cluster-yes']);
    const cluster = {
      url: all.map((address) => `${tls ? 'rediss' : 'redis'}://${address}`).join(','),
      nodes: nodes.map(({ port, child }) => ({ port, pid: child.pid })),
      cli: run,
      kill(port) {
        cluster.signal(port, 'SIGKILL');
      },
      signal(port, signal) {
        nodes.find((node) => node.port === port)?.child.kill(signal);
      },
      /** The port of the master that serves `slot`, as the node at `askPort` sees it. */
      async masterOf(slot, askPort = nodes[0].port) {
        const shards = JSON.parse(await run(askPort, '--json', 'CLUSTER', 'SLOTS'));
        const range = shards.find(([start, end]) => start <= slot && slot <= end);
        return range ? Number(range[2][1]) : undefined;
      },
      /** Polls `check` every 100 ms until it resolves true, for up to `ms`. */
      async waitUntil(check, what, ms = 20_000) {
        const end = Date.now() + ms;
        while (!(await check().catch(() => false))) {
          if (Date.now() > end) throw new Error(`the cluster did not get there within ${ms} ms: ${what}`);
          await sleep(100);
        }
      },
      stop,
    };
    // Ready once every node sees all slots served and every replica has synced.
    await cluster.waitUntil(async () => {
      for (const { port } of nodes) {
        const info = fields(await run(port, 'CLUSTER', 'INFO'));
        if (info.cluster_state !== 'ok' || Number(info.cluster_known_nodes) !== nodes.length) return false;
        const replication = fields(await run(port, 'INFO', 'replication'));
        if (replication.role === 'slave' && replication.master_link_status !== 'up') return false;
      }
      return true;
    }, 'every node in state ok, every replica synced');
    return cluster;
  } catch (error) {
    await stop();
    throw error;
  }
}

/** The cluster slot of a key: CRC16 (XMODEM) of the key, or of its non-empty `{hash tag}`, modulo 16384. */
function slotOf(key) {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf('{');
  if (open >= 0) {
    const close = bytes.indexOf('}', open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

module.exports = { startCluster, slotOf };
