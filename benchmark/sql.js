'use strict';
// What the SQL scenarios (postgres.js, mysql.js, sqlite.js) share: their rows of hits in flight, their
// columns, driving a store for a while, one measured round of a store on a row, the rounds interleaved
// store by store, and their tables' rows.

const { execFileSync } = require('node:child_process');
const { readFileSync } = require('node:fs');
const { performance } = require('node:perf_hooks');
const { summary, rotated } = require('./stats.js');

const WINDOW_MS = 60_000;

/** The measured rows of scenario `name`: hits in flight, over 10,000 keys or one. */
function inFlightRows(name) {
  return [
    { id: `${name}-1`, width: 1, label: '1 in flight' },
    { id: `${name}-16`, width: 16, label: '16 in flight' },
    { id: `${name}-256`, width: 256, label: '256 in flight' },
    { id: `${name}-hot`, width: 256, label: '256 in flight on one hot key', hot: true },
  ];
}

/** The columns of a scenario's tables: with the mean latency (`mean`) and the server's CPU (`server`) or not. */
function sqlColumns({ mean = false, server = false } = {}) {
  return [
    { name: 'ops/s', range: true, unit: 'ops/s' },
    { name: 'p50 us', unit: 'us' },
    { name: 'p99 us', unit: 'us' },
    ...(mean ? [{ name: 'mean us', unit: 'us' }] : []),
    { name: 'client us/hit', unit: 'us' },
    ...(server ? [{ name: 'server us/hit', unit: 'us' }] : []),
    { name: 'errors', unit: 'count' },
  ];
}

const TICK_US = 1e6 / Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());

/** The fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [11] utime ... [14] cstime. */
function statFields(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** Hits for `ms`, `width` of them in flight, over `keys` (or its first alone): hits, errors, latencies (ms). */
async function driveFor(store, keys, width, ms, hot) {
  const latencies = [];
  let next = 0;
  let errors = 0;
  let firstError;
  const end = performance.now() + ms;
  async function worker() {
    while (performance.now() < end) {
      const key = hot ? keys[0] : keys[next++ % keys.length];
      const start = performance.now();
      try {
        await store.hit(key, WINDOW_MS, 1);
        latencies.push(performance.now() - start);
      } catch (error) {
        errors++;
        firstError ??= error;
      }
    }
  }
  const start = performance.now();
  await Promise.all(Array.from({ length: width }, worker));
  return { hits: latencies.length, errors, firstError, ms: performance.now() - start, latencies };
}

function push(samples, measure, value) {
  (samples[measure] ??= []).push(value);
}

/**
 * One measured round of a store (`entry`) on one row, its samples added to `entry.samples[row.id]`.
 * `scenario` names it in the log; `serverCpuUs()`, when given, is the server's CPU so far (us);
 * `mean`: whether the mean latency is a column.
 */
async function storeRound(scenario, entry, row, keys, ms, gc, { serverCpuUs, mean = false } = {}) {
  gc();
  const server = serverCpuUs?.();
  const cpu = process.cpuUsage();
  const r = await driveFor(entry.store, keys, row.width, ms, row.hot);
  const used = process.cpuUsage(cpu);
  const serverUs = serverCpuUs === undefined ? undefined : serverCpuUs() - server;
  if (r.errors > 0) {
    console.log(`  ${scenario}: ${entry.name}, ${row.label}: ${r.errors} errors, the first: ${r.firstError?.message}`);
  }
  const samples = entry.samples[row.id];
  const hits = Math.max(r.hits, 1);
  const sorted = Float64Array.from(r.latencies).sort();
  push(samples, 'ops/s', r.hits / (r.ms / 1000));
  push(samples, 'p50 us', sorted[Math.floor(sorted.length * 0.5)] * 1000);
  push(samples, 'p99 us', sorted[Math.floor(sorted.length * 0.99)] * 1000);
  if (mean) push(samples, 'mean us', (sorted.reduce((a, b) => a + b, 0) / hits) * 1000);
  push(samples, 'client us/hit', (used.user + used.system) / hits);
  if (serverUs !== undefined) push(samples, 'server us/hit', serverUs / hits);
  push(samples, 'errors', r.errors);
}

/**
 * The rounds of scenario `scenario`: each round runs `round(entry, row)` for every row and entry, the
 * entries in a turned order each round; each entry's samples are kept by row.
 */
async function runRounds(scenario, rounds, rows, entries, round) {
  for (const entry of entries) for (const row of rows) entry.samples[row.id] = {};
  for (let i = 0; i < rounds; i++) {
    for (const row of rows) {
      for (const entry of rotated(entries, i)) await round(entry, row);
    }
    console.log(`  ${scenario}: round ${i + 1} of ${rounds} done`);
  }
}

/** A table's rows for `row`: each entry's samples summed up, under `name(entry)` (its name by default). */
function tableRows(entries, row, name = (entry) => entry.name) {
  return entries.map((entry) => {
    const values = {};
    for (const [measure, list] of Object.entries(entry.samples[row.id])) values[measure] = summary(list);
    return { store: name(entry), peer: entry.peer, values };
  });
}

module.exports = {
  WINDOW_MS,
  TICK_US,
  inFlightRows,
  sqlColumns,
  statFields,
  driveFor,
  push,
  storeRound,
  runRounds,
  tableRows,
};
