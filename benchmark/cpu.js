'use strict';
// The CPU scenario: what each Redis store costs the process it runs in. A
// store process per run (cpu-child.js) serves hit requests from a load
// generator in a process of its own (load.py), paced (steady or Poisson
// arrivals, 1 or 16 hits at a time) or saturated; the generator reads the
// CPU time of every thread of the store process and of redis-server.

const { execFile, spawn } = require('node:child_process');
const { mkdtempSync, rmSync } = require('node:fs');
const os = require('node:os');
const { join } = require('node:path');
const { promisify } = require('node:util');
const { startRedis } = require('./redis.js');
const { self } = require('./self.js');

// memoryStore() last: the floor, what serving the generator's requests costs the process with no Redis.
const STORES = [
  'redisStore()',
  'node-redis 5 EVALSHA',
  'ioredis EVALSHA',
  'Valkey GLIDE 2 invokeScript',
  'memoryStore()',
];
const BASELINE = 'node-redis 5 EVALSHA';
const run = promisify(execFile);

function loads(mode) {
  // A smoke run's one load: load.py's paced path runs in the PostgreSQL scenario's paced row.
  if (mode === 'smoke') return [{ mode: 'saturated', rate: 0, burst: 16 }];
  const paced = [];
  for (const burst of [1, 16])
    for (const arrival of ['steady', 'poisson'])
      for (const rate of [500, 5_000, 20_000]) paced.push({ mode: arrival, rate, burst });
  return [...paced, { mode: 'saturated', rate: 0, burst: 16 }];
}

const label = ({ mode, rate, burst }) =>
  mode === 'saturated'
    ? `saturated, ${burst} in flight`
    : `${rate.toLocaleString('en-US')}/s ${mode}, ${burst} at a time`;

/**
 * One run: a fresh store process under one load. `server`: { port, pid } of a redis-server, or
 * { port: a URL, pids() } of a server of several processes.
 */
async function measure(name, server, load, seconds, dir) {
  const socket = join(dir, `store-${process.hrtime.bigint()}.sock`);
  const [command, args] = self(join(__dirname, 'cpu-child.js'), [name, String(server.port), socket]);
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`${name}: the store process exited (${code})`)));
      child.stdout.once('data', resolve);
    });
    // The server's processes once the store is connected: a PostgreSQL cluster's include its backends.
    const serverPids = server.pids ? server.pids() : [server.pid];
    const args = [
      join(__dirname, 'load.py'),
      socket,
      [child.pid, ...serverPids].join(','),
      load.mode,
      String(load.rate),
    ];
    args.push(String(load.burst), String(seconds));
    const { stdout } = await run('python3', args, { timeout: (seconds + 30) * 1000 });
    return JSON.parse(stdout);
  } finally {
    child.kill('SIGKILL');
  }
}

/** Markdown for the whole scenario: one row per load and store, ratios against node-redis under the same load. */
function render(rows) {
  const lines = [
    '### CPU per hit: a store process serving paced hit requests from a load generator in another process',
    '',
    'Unit: us of CPU per hit, every thread of the process (user + system, from /proc), and the same for',
    'redis-server; user and system split it (from /proc/PID/stat, 10 ms clock ticks: sampled, so they',
    "need not add up exactly); latency in us per hit as the generator saw it. Ratio: this store's CPU per hit",
    `over ${BASELINE}'s under the same load; lower is better.`,
    '',
    '| load | store | CPU us/hit | user | system | cores | redis-server us/hit | p50 us | p99 us | hits/s | ratio (CPU) |',
    '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ];
  for (const { load, results } of rows) {
    const base = results.find((r) => r.store === BASELINE)?.storeUsPerHit;
    for (const r of results) {
      const ratio = Number.isFinite(base) ? `${(r.storeUsPerHit / base).toFixed(2)}x` : '';
      lines.push(
        `| ${label(load)} | ${r.store} | ${r.storeUsPerHit.toFixed(1)} | ${r.storeUserUsPerHit.toFixed(1)} | ` +
          `${r.storeSystemUsPerHit.toFixed(1)} | ${r.storeCores.toFixed(2)} | ` +
          `${r.redisUsPerHit.toFixed(1)} | ${r.p50.toFixed(0)} | ${r.p99.toFixed(0)} | ` +
          `${Math.round(r.rate).toLocaleString('en-US')} | ${ratio} |`,
      );
    }
  }
  return lines.join('\n');
}

async function cpu(mode) {
  await run('python3', ['--version']).catch(() => {
    throw new Error('the CPU scenario runs its load generator with python3, and none was found on PATH');
  });
  const seconds = mode === 'smoke' ? 0.3 : mode === 'quick' ? 1 : 2;
  const server = await startRedis();
  const dir = mkdtempSync(join(os.tmpdir(), 'ratestore-cpu-'));
  const rows = [];
  try {
    for (const load of loads(mode)) {
      const results = [];
      for (const store of STORES) results.push({ store, ...(await measure(store, server, load, seconds, dir)) });
      rows.push({ load, results });
      console.log(
        `  cpu: ${label(load)}: ${results.map((r) => `${r.store} ${r.storeUsPerHit.toFixed(1)} us`).join(', ')}`,
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await server.stop();
  }
  return { id: 'cpu', rows, markdown: render(rows) };
}

/** The targets: redisStore's CPU per hit at most 0.8x node-redis's under every load, and p50 no worse at 1 at a time. */
function cpuTargets(t) {
  const lines = [];
  for (const { load, results } of t.rows) {
    const mine = results.find((r) => r.store === STORES[0]);
    const base = results.find((r) => r.store === BASELINE);
    if (!mine || !base) continue;
    const ratio = mine.storeUsPerHit / base.storeUsPerHit;
    lines.push(
      `- redisStore CPU per hit <= 0.8x ${BASELINE}, ${label(load)}: ${ratio.toFixed(2)}x, ${ratio <= 0.8 ? 'met' : 'MISSED'}`,
    );
    if (load.burst === 1 && load.mode !== 'saturated') {
      const p50 = mine.p50 / base.p50;
      lines.push(
        `- redisStore p50 <= ${BASELINE}'s, ${label(load)}: ${p50.toFixed(2)}x, ${p50 <= 1 ? 'met' : 'MISSED'}`,
      );
    }
  }
  return lines;
}

module.exports = { cpu, cpuTargets, measure, label, BASELINE };
