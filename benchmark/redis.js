'use strict';
// The benchmark's own redis-server on a free loopback port, and
// redis-benchmark's EVALSHA figure on it: the most the server does.

const { execFile, spawn } = require('node:child_process');
const { createConnection } = require('node:net');
const { setTimeout: sleep } = require('node:timers/promises');
const { promisify } = require('node:util');
const { freePort } = require('../scripts/free-port.js');

const run = promisify(execFile);
const INSTALL = 'install Redis 7 (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)';

function answers(port) {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    socket.once('connect', () => socket.end(() => resolve(true)));
    socket.once('error', () => resolve(false));
  });
}

/** Starts a redis-server with no persistence (and `args`); resolves { port, pid, version, stop }. */
async function startRedis(args = []) {
  const version = await run('redis-server', ['--version']).then(
    ({ stdout }) => /v=(\S+)/.exec(stdout)?.[1] ?? stdout.trim(),
    () => {
      throw new Error(`the benchmark starts its own redis-server, and none was found on PATH: ${INSTALL}`);
    },
  );
  const port = await freePort();
  const server = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no', ...args],
    { stdio: 'ignore' },
  );
  const exited = new Promise((resolve) => server.once('exit', resolve));
  const stop = async () => {
    if (server.exitCode === null && server.signalCode === null) process.kill(server.pid, 'SIGTERM');
    await exited;
  };
  process.once('exit', () => server.exitCode === null && process.kill(server.pid, 'SIGKILL'));
  for (let tries = 0; tries < 100; tries++) {
    if (server.exitCode !== null) throw new Error(`redis-server exited at start (code ${server.exitCode})`);
    if (await answers(port)) return { port, pid: server.pid, version, stop };
    await sleep(50);
  }
  await stop();
  throw new Error('redis-server did not answer within 5 s');
}

/** redis-benchmark running EVALSHA of the script with a pipeline: { opsPerSec, p50Us, p99Us }. */
async function redisBenchmark(port, sha, { requests, pipeline }) {
  const args = ['-h', '127.0.0.1', '-p', String(port), '-P', String(pipeline), '-n', String(requests), '-r', '10000'];
  args.push('--csv', 'EVALSHA', sha, '1', 'key:__rand_int__', '60000', '1');
  const { stdout } = await run('redis-benchmark', args).catch((error) => {
    throw new Error(`redis-benchmark failed (${INSTALL}): ${error.message}`);
  });
  // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  const row = stdout
    .trim()
    .split('\n')
    .map((line) => line.split(',').map((cell) => cell.replace(/"/g, '')))
    .find((cells) => /^EVALSHA/i.test(cells[0]));
  if (!row) throw new Error(`redis-benchmark printed no EVALSHA figure: ${stdout.slice(0, 200)}`);
  return { opsPerSec: Number(row[1]), p50Us: Number(row[4]) * 1000, p99Us: Number(row[6]) * 1000 };
}

function benchmarkCommand(port, sha, requests) {
  return `redis-benchmark -h 127.0.0.1 -p ${port} -P 16 -n ${requests} -r 10000 --csv EVALSHA ${sha} 1 key:__rand_int__ 60000 1`;
}

module.exports = { startRedis, redisBenchmark, benchmarkCommand };
