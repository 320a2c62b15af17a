'use strict';
// `npm run bench`: ratestore against the stores it replaces, in one process
// run, interleaved round by round after a warm-up. Prints one table per
// scenario; a full run also writes them to benchmark/RESULTS.md.
//
//   npm run bench                 full run (about 5-10 minutes on 2 cores)
//   npm run bench -- --quick      fewer rounds and hits: a fast look
//   npm run bench -- --smoke      tiny sizes: checks every scenario runs (npm test does this)
//   npm run bench -- --only=seq,inflight,footprint,stall,full,workers,redis,replica,cluster,consume,flood,rest,cpu,postgres,sqlite,mysql
//   npm run bench -- --runtime=bun    the same run on Bun (or deno), as pinned in runtimes/

const { execFile, spawn } = require('node:child_process');
const { mkdtempSync, readFileSync, rmSync, writeFileSync } = require('node:fs');
const os = require('node:os');
const { join } = require('node:path');
const { performance } = require('node:perf_hooks');
const { promisify } = require('node:util');
const { Worker } = require('node:worker_threads');
const {
  memoryStores,
  turnover,
  floor,
  redisStores,
  replicaStores,
  clusterStores,
  restStores,
  postgresStores,
  WINDOW_MS,
  REFERENCE_LUA,
} = require('./stores.js');
const CLUSTER_STORE = clusterStores.find((s) => !s.peer).name;
const { summary, bestPeer, table, rotated } = require('./stats.js');
const { startRedis, redisBenchmark, benchmarkCommand } = require('./redis.js');
const { startCluster } = require('../scripts/redis-cluster.js');
const { startRest } = require('../scripts/rest-endpoint.js');
const { cpu, cpuTargets } = require('./cpu.js');
const { self, runtime, runtimeName } = require('./self.js');
const { memoryConsumers, redisConsumers } = require('./consume.js');
const { flood, flooders } = require('./flood.js');
const { postgres, pgbenchAbout } = require('./postgres.js');
const { sqlite, sqliteStores } = require('./sqlite.js');
const { mysqlScenario } = require('./mysql.js');

const SIZES = {
  full: {
    // Many short rounds: a burst of load from elsewhere on the machine then
    // lands in a few rounds of every store rather than in one store's round.
    rounds: 21,
    hits: 100_000,
    childRounds: 3,
    footprint: 1_000_000,
    stall: [1_000_000, 1_300_000],
    full: { count: 1_000_000, hits: 5_000 },
    workerRounds: 7,
    workerHits: 200_000,
    redisRounds: 5,
    redisHits: { 1: 8_000, 16: 40_000, 256: 80_000 },
    replicaHits: { 1: 3_000, 16: 15_000, 256: 30_000 },
    restHits: { 1: 2_000, 256: 20_000 },
    benchmarkRequests: 500_000,
    floodChecks: 200_000,
    floodKeys: 10_000,
    // Time per store, row and round: 4 rows of 4 stores and pgbench, 3 rounds, about 3 minutes in all.
    postgres: { rounds: 3, seconds: 2, warmSeconds: 1, pacedSeconds: 2 },
    sqlite: { rounds: 3, seconds: 2, warmSeconds: 1 },
    mysql: { rounds: 3, seconds: 2, warmSeconds: 1 },
  },
  quick: {
    rounds: 7,
    hits: 50_000,
    childRounds: 1,
    footprint: 1_000_000,
    stall: [1_000_000, 1_300_000],
    full: { count: 1_000_000, hits: 2_000 },
    workerRounds: 3,
    workerHits: 50_000,
    redisRounds: 2,
    redisHits: { 1: 3_000, 16: 15_000, 256: 30_000 },
    replicaHits: { 1: 1_500, 16: 8_000, 256: 15_000 },
    restHits: { 1: 1_000, 256: 10_000 },
    benchmarkRequests: 200_000,
    floodChecks: 100_000,
    floodKeys: 10_000,
    postgres: { rounds: 2, seconds: 1, warmSeconds: 0.5, pacedSeconds: 2 },
    sqlite: { rounds: 2, seconds: 1, warmSeconds: 0.5 },
    mysql: { rounds: 2, seconds: 1, warmSeconds: 0.5 },
  },
  smoke: {
    rounds: 1,
    hits: 2_000,
    childRounds: 1,
    footprint: 2_000,
    stall: [2_000, 2_600],
    full: { count: 2_000, hits: 200 },
    workerRounds: 1,
    workerHits: 1_000,
    redisRounds: 1,
    redisHits: { 1: 100, 16: 300, 256: 600 },
    replicaHits: { 1: 50, 16: 200, 256: 400 },
    restHits: { 1: 50, 256: 300 },
    benchmarkRequests: 2_000,
    floodChecks: 2_000,
    floodKeys: 1_000,
    postgres: { rounds: 1, seconds: 0.2, warmSeconds: 0.1, pacedSeconds: 0.3, pgbenchTransactions: 4 },
    sqlite: { rounds: 1, seconds: 0.2, warmSeconds: 0.1 },
    mysql: { rounds: 1, seconds: 0.2, warmSeconds: 0.1 },
  },
};
const SCENARIOS = [
  'seq',
  'inflight',
  'footprint',
  'stall',
  'full',
  'workers',
  'redis',
  'replica',
  'cluster',
  'consume',
  'flood',
  'rest',
  'cpu',
  'postgres',
  'sqlite',
  'mysql',
];
/** The widths of the REST tables: a lone request's round trip, and pipelines under load. */
const REST_WIDTHS = [1, 256];
const WIDTHS = [1, 16, 256];
/** The columns of every Redis table: throughput and latency per hit. */
const REDIS_COLUMNS = [
  { name: 'ops/s', range: true, unit: 'ops/s' },
  { name: 'p50 us', unit: 'us' },
  { name: 'p99 us', unit: 'us' },
  { name: 'client cores', unit: 'cores' },
  { name: 'client CPU us/hit', unit: 'us' },
  { name: 'redis-server cores', unit: 'cores' },
];
const KEYS = Array.from({ length: 10_000 }, (_, i) => `ratelimit:chat:ip:10.0.${i >> 8}.${i & 255}`);

const gc = typeof global.gc === 'function' ? global.gc : () => {};
const execNode = promisify(execFile);

/** Runs `hits` hits over KEYS, `width` of them in flight; records each hit's latency (ms) when asked. */
async function drive(store, hits, width, latencies) {
  let next = 0;
  async function worker() {
    while (next < hits) {
      const i = next++;
      if (latencies === undefined) {
        await store.hit(KEYS[i % KEYS.length], WINDOW_MS, 1);
      } else {
        const start = performance.now();
        await store.hit(KEYS[i % KEYS.length], WINDOW_MS, 1);
        latencies[i] = performance.now() - start;
      }
    }
  }
  const start = performance.now();
  await Promise.all(Array.from({ length: width }, worker));
  return hits / ((performance.now() - start) / 1000);
}

/**
 * `drive` with each hit's key built as the hit is made, as a limiter builds `prefix:ip` per request: the same
 * 10,000 keys, but a new string each time, so no store meets a string whose hash V8 has already cached.
 */
async function driveFresh(store, hits, width) {
  let next = 0;
  async function worker() {
    while (next < hits) {
      const i = next++ % KEYS.length;
      await store.hit(`ratelimit:chat:ip:10.0.${i >> 8}.${i & 255}`, WINDOW_MS, 1);
    }
  }
  const start = performance.now();
  await Promise.all(Array.from({ length: width }, worker));
  return hits / ((performance.now() - start) / 1000);
}

function collect(entries) {
  return new Map(entries.map((entry) => [entry.name, {}]));
}

function push(samples, name, measure, value) {
  (samples.get(name)[measure] ??= []).push(value);
}

function rows(entries, samples) {
  return entries.map((entry) => {
    const values = {};
    for (const [measure, list] of Object.entries(samples.get(entry.name) ?? {})) values[measure] = summary(list);
    return { store: entry.name, peer: entry.peer, values };
  });
}

async function throughput(size, only) {
  const entries = [...memoryStores, floor].map((spec) => ({ ...spec, store: spec.create() }));
  const samples = collect(entries);
  for (const { store } of entries) {
    await drive(store, size.hits, 1);
    await drive(store, size.hits, 100);
    await driveFresh(store, size.hits, 1);
  }
  for (let round = 0; round < size.rounds; round++) {
    for (const entry of rotated(entries, round)) {
      if (only.has('seq')) {
        gc();
        push(samples, entry.name, 'ops/s', await drive(entry.store, size.hits, 1));
        gc();
        push(samples, entry.name, 'ops/s, key built per hit', await driveFresh(entry.store, size.hits, 1));
      }
      if (only.has('inflight')) {
        gc();
        push(samples, entry.name, 'ops/s 100', await drive(entry.store, size.hits, 100));
        gc();
        push(samples, entry.name, 'ops/s 100, key built per hit', await driveFresh(entry.store, size.hits, 100));
      }
    }
  }
  for (const { store } of entries) store.close?.();
  const tables = [];
  const shape = { unit: 'ops/s', higherIsBetter: true };
  if (only.has('seq')) {
    tables.push({
      ...shape,
      id: 'seq',
      title: `Sequential: awaited hits, one at a time, over ${KEYS.length.toLocaleString('en-US')} keys`,
      ratioOf: 'ops/s',
      columns: [
        { name: 'ops/s', range: true },
        { name: 'ops/s, key built per hit', range: true },
      ],
      rows: rows(entries, samples),
    });
  }
  if (only.has('inflight')) {
    tables.push({
      ...shape,
      id: 'inflight',
      title: `100 in flight: 100 async loops of awaited hits over ${KEYS.length.toLocaleString('en-US')} keys`,
      ratioOf: 'ops/s 100',
      columns: [
        { name: 'ops/s 100', range: true },
        { name: 'ops/s 100, key built per hit', range: true },
      ],
      rows: rows(entries, samples),
    });
  }
  return tables;
}

async function child(args) {
  const [command, childArgs] = self(join(__dirname, 'child.js'), args, { gc: true });
  const { stdout } = await execNode(command, childArgs, {
    maxBuffer: 1 << 20,
  });
  return JSON.parse(stdout.trim().split('\n').pop());
}

async function footprint(size) {
  const samples = collect(memoryStores);
  for (let round = 0; round < size.childRounds; round++) {
    const base = await child(['footprint', 'keys only', String(size.footprint)]);
    for (const entry of rotated(memoryStores, round)) {
      const r = await child(['footprint', entry.name, String(size.footprint)]);
      push(samples, entry.name, 'B/counter', (r.rss - base.rss) / r.count);
      push(samples, entry.name, 'V8 heap B/counter', (r.heap - base.heap) / r.count);
    }
  }
  return [
    {
      id: 'footprint',
      title: `Footprint: ${size.footprint.toLocaleString('en-US')} distinct 64-character keys hit once, a fresh process per store`,
      unit: 'bytes per counter (RSS growth less a run that only makes the keys)',
      higherIsBetter: false,
      ratioOf: 'B/counter',
      columns: [
        { name: 'B/counter', range: true, unit: 'B' },
        { name: 'V8 heap B/counter', unit: 'B' },
      ],
      rows: rows(memoryStores, samples),
    },
  ];
}

async function stall(size) {
  const stores = [...memoryStores, turnover];
  const samples = collect(stores);
  for (let round = 0; round < size.childRounds; round++) {
    for (const entry of rotated(stores, round)) {
      const r = await child(['stall', entry.name, ...size.stall.map(String)]);
      for (const measure of ['p50', 'p99', 'p999', 'max']) push(samples, entry.name, measure, r[measure]);
    }
  }
  const [from, to] = size.stall.map((n) => n.toLocaleString('en-US'));
  return [
    {
      id: 'stall',
      title: `Stall: per-hit latency of awaited hits while a store grows from ${from} to ${to} counters, a fresh process per store`,
      unit: 'us per hit',
      higherIsBetter: false,
      ratioOf: 'max',
      columns: [
        { name: 'p50', unit: 'us' },
        { name: 'p99', unit: 'us' },
        { name: 'p999', unit: 'us' },
        { name: 'max', range: true, unit: 'us' },
      ],
      rows: rows(stores, samples),
    },
  ];
}

/** The full-store cases, as child.js runs them: a fresh key on a store with room, on one that evicts, on one that refuses. */
const FULL_CASES = [
  { name: 'room', label: 'with room: maxKeys twice the counters, 2-hour windows', peer: true },
  { name: 'evicts', label: 'full of 1-hour windows: evicts the soonest-ending' },
  { name: 'refused', label: 'full of 2-hour windows: refused with ERR_STORE_FULL' },
  { name: 'invalid', label: 'floor of a rejected hit: windowMs 0, refused by the JS checks' },
];

async function full(size) {
  const entries = FULL_CASES.map((c) => ({ ...c, name: c.label }));
  const samples = collect(entries);
  const { count, hits } = size.full;
  for (let round = 0; round < size.childRounds; round++) {
    for (const [i, entry] of rotated([...FULL_CASES.keys()], round).map((i) => [i, entries[i]])) {
      const r = await child(['full', FULL_CASES[i].name, String(count), String(hits)]);
      for (const measure of ['p50', 'p99', 'p999', 'max']) push(samples, entry.name, measure, r[measure]);
    }
  }
  return [
    {
      id: 'full',
      title:
        `Full store: ${hits.toLocaleString('en-US')} awaited hits of fresh keys on a memoryStore holding ` +
        `${count.toLocaleString('en-US')} counters, a fresh process per case`,
      unit: 'us per hit',
      higherIsBetter: false,
      peerIs: 'the hit with room',
      ratioOf: 'p99',
      columns: [
        { name: 'p50', unit: 'us' },
        { name: 'p99', range: true, unit: 'us' },
        { name: 'p999', unit: 'us' },
        { name: 'max', unit: 'us' },
      ],
      rows: rows(entries, samples),
    },
  ];
}

/** `threads` worker threads hitting one named memoryStore at once: total hits per second over the slowest. */
async function workerRound(name, threads, hits) {
  const workers = Array.from(
    { length: threads },
    (_, i) =>
      new Worker(join(__dirname, 'worker.js'), {
        workerData: { name, hits, keys: KEYS.length, offset: (i * KEYS.length) / threads, windowMs: WINDOW_MS },
      }),
  );
  try {
    const next = (worker) =>
      new Promise((resolve, reject) => {
        worker.once('message', resolve);
        worker.once('error', reject);
      });
    await Promise.all(workers.map(next));
    const done = workers.map(next);
    for (const worker of workers) worker.postMessage('go');
    const elapsed = await Promise.all(done);
    return (threads * hits) / (Math.max(...elapsed) / 1000);
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

const WORKER_THREADS = [
  { name: 'memoryStore({ name }), 1 worker thread', threads: 1, peer: true },
  { name: 'memoryStore({ name }), 4 worker threads', threads: 4 },
];

async function workers(size) {
  const samples = collect(WORKER_THREADS);
  const store = `bench-workers-${process.pid}`;
  await workerRound(store, 1, size.workerHits / 10);
  for (let round = 0; round < size.workerRounds; round++) {
    for (const entry of rotated(WORKER_THREADS, round)) {
      push(samples, entry.name, 'ops/s', await workerRound(store, entry.threads, size.workerHits));
    }
  }
  return [
    {
      id: 'workers',
      title:
        `Worker threads: each makes ${size.workerHits.toLocaleString('en-US')} awaited hits over ` +
        `${KEYS.length.toLocaleString('en-US')} keys of one named memoryStore, all at once`,
      unit: 'ops/s, all threads together',
      higherIsBetter: true,
      peerIs: 'one thread',
      ratioOf: 'ops/s',
      columns: [{ name: 'ops/s', range: true, unit: 'ops/s' }],
      rows: rows(WORKER_THREADS, samples),
    },
  ];
}

async function redis(size, notes) {
  const server = await startRedis();
  notes.redisVersion = server.version;
  const entries = [];
  try {
    for (const spec of redisStores) {
      entries.push({ ...spec, store: await spec.create(server.port) });
    }
    const sha = await scriptLoad(server.port);
    notes.benchmarkCommand = benchmarkCommand(server.port, sha, size.benchmarkRequests).replace(/-p \d+/, '-p PORT');
    for (const { store } of entries) await drive(store, size.redisHits[16], 16);
    const limit = [];
    const samples = await widthRounds(entries, WIDTHS, size.redisHits, size.redisRounds, server, async () => {
      limit.push(await redisBenchmark(server.port, sha, { requests: size.benchmarkRequests, pipeline: 16 }));
    });
    const benchmarkRow = {
      store: 'limit: redis-benchmark EVALSHA -P 16',
      values: {
        'ops/s': summary(limit.map((l) => l.opsPerSec)),
        'p50 us': summary(limit.map((l) => l.p50Us)),
        'p99 us': summary(limit.map((l) => l.p99Us)),
      },
    };
    return WIDTHS.map((width, w) =>
      redisTable(
        `redis-${width}`,
        `Redis, ${width} in flight: the reference script on one connection per store (10,000 keys)`,
        [...rows(entries, samples[w]), benchmarkRow],
      ),
    );
  } finally {
    for (const { store } of entries) await store?.close?.();
    await server.stop();
  }
}

/**
 * A primary with one replica (in sync before the first round): what answering only what the replica has
 * costs, with `waitForReplicas` and with a `WAIT` after every hit.
 */
async function replica(size) {
  const dir = mkdtempSync(join(os.tmpdir(), 'ratestore-bench-replica-'));
  const sync = ['--dir', dir, '--repl-diskless-sync-delay', '0'];
  const primary = await startRedis(sync);
  const entries = [];
  let secondary;
  try {
    secondary = await startRedis([...sync, '--replicaof', '127.0.0.1', String(primary.port)]);
    await inSync(primary.port);
    for (const spec of replicaStores) entries.push({ ...spec, store: await spec.create(primary.port) });
    for (const { store } of entries) await drive(store, size.replicaHits[16], 16);
    const samples = await widthRounds(entries, WIDTHS, size.replicaHits, size.redisRounds, primary);
    return WIDTHS.map((width, w) =>
      redisTable(
        `replica-${width}`,
        `Redis with a replica, ${width} in flight: answered once the replica has the count ` +
          '(the reference script, 10,000 keys; redis-server cores: the primary)',
        rows(entries, samples[w]),
      ),
    );
  } finally {
    for (const { store } of entries) await store?.close?.();
    await secondary?.stop();
    await primary.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Resolves once the primary on `port` has a replica online, within 20 s. */
async function inSync(port) {
  const Redis = require('ioredis');
  const client = new Redis({ host: '127.0.0.1', port });
  try {
    for (let tries = 0; tries < 200; tries++) {
      if (/slave0:.*state=online/.test(await client.info('replication'))) return;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error('the replica did not sync with the primary within 20 s');
  } finally {
    client.disconnect();
  }
}

/**
 * `rounds` rounds of every entry at each of `widths` in flight (`hits[width]` hits each), in an order that
 * turns round by round, then `afterRound()`; one set of samples per width.
 */
async function widthRounds(entries, widths, hits, rounds, server, afterRound = async () => {}) {
  const samples = widths.map(() => collect(entries));
  for (let round = 0; round < rounds; round++) {
    for (const [w, width] of widths.entries()) {
      for (const entry of rotated(entries, round)) await redisRound(samples[w], entry, hits[width], width, server);
    }
    await afterRound();
  }
  return samples;
}

/** A Redis table: throughput and latency per hit, the ratio taken of ops/s. */
function redisTable(id, title, tableRows) {
  return {
    id,
    title,
    unit: 'ops/s; latency in us per hit',
    higherIsBetter: true,
    ratioOf: 'ops/s',
    columns: REDIS_COLUMNS,
    rows: tableRows,
  };
}

/** A process's CPU time so far (user + system, every thread), in ms: /proc's clock ticks of 10 ms. */
function serverCpuMs(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** One measured round of a Redis store: its ops/s, p50, p99, and the cores it and the server kept busy. */
async function redisRound(samples, entry, hits, width, server) {
  const latencies = new Float64Array(hits);
  gc();
  const before = [performance.now(), process.cpuUsage(), server && serverCpuMs(server.pid)];
  const ops = await drive(entry.store, hits, width, latencies);
  const ms = performance.now() - before[0];
  const used = process.cpuUsage(before[1]);
  // Cores busy while the round ran: which side is the limit (a core is 1.00).
  push(samples, entry.name, 'client cores', (used.user + used.system) / 1000 / ms);
  // The process's CPU time (every thread: a client's own I/O threads too) over the hits it served.
  push(samples, entry.name, 'client CPU us/hit', (used.user + used.system) / hits);
  if (server) push(samples, entry.name, 'redis-server cores', (serverCpuMs(server.pid) - before[2]) / ms);
  latencies.sort();
  push(samples, entry.name, 'ops/s', ops);
  push(samples, entry.name, 'p50 us', latencies[Math.floor(hits * 0.5)] * 1000);
  push(samples, entry.name, 'p99 us', latencies[Math.floor(hits * 0.99)] * 1000);
}

/** Limit-aware consumes: awaited one at a time in memory, 16 in flight on Redis. */
async function consumeScenario(size) {
  const memory = memoryConsumers.map((spec) => ({ ...spec, store: spec.create() }));
  const memorySamples = collect(memory);
  for (const { store } of memory) await drive(store, size.hits, 1);
  for (let round = 0; round < size.rounds; round++) {
    for (const entry of rotated(memory, round)) {
      gc();
      push(memorySamples, entry.name, 'ops/s', await drive(entry.store, size.hits, 1));
    }
  }
  const server = await startRedis();
  const redis = [];
  try {
    for (const spec of redisConsumers) redis.push({ ...spec, store: await spec.create(server.port) });
    for (const { store } of redis) await drive(store, size.redisHits[16], 16);
    const redisSamples = collect(redis);
    for (let round = 0; round < size.redisRounds; round++) {
      for (const entry of rotated(redis, round)) await redisRound(redisSamples, entry, size.redisHits[16], 16);
    }
    return [
      {
        id: 'consume-memory',
        title: `Consume in memory: awaited limit-aware consumes, one at a time, over ${KEYS.length.toLocaleString('en-US')} keys`,
        unit: 'ops/s',
        higherIsBetter: true,
        ratioOf: 'ops/s',
        columns: [{ name: 'ops/s', range: true }],
        rows: rows(memory, memorySamples),
      },
      {
        id: 'consume-redis',
        title: 'Consume on Redis, 16 in flight: limit-aware consumes on one connection per store (10,000 keys)',
        unit: 'ops/s; latency in us per call',
        higherIsBetter: true,
        ratioOf: 'ops/s',
        columns: REDIS_COLUMNS,
        rows: rows(redis, redisSamples),
      },
    ];
  } finally {
    for (const { store } of redis) await store?.close?.();
    await server.stop();
  }
}

async function cluster(size) {
  const server = await startCluster();
  const entries = [];
  try {
    for (const spec of clusterStores) entries.push({ ...spec, store: await spec.create(server.url) });
    for (const { store } of entries) await drive(store, size.redisHits[16], 16);
    const [samples] = await widthRounds(entries, [256], size.redisHits, size.redisRounds);
    return [
      redisTable(
        'cluster-256',
        'Redis Cluster, 256 in flight: the reference script on 3 masters with a replica each (10,000 keys)',
        rows(entries, samples),
      ),
    ];
  } finally {
    for (const { store } of entries) await store?.close?.();
    await server.stop();
  }
}

/** Upstash's REST protocol: the test endpoint (its own process) in front of the benchmark's redis-server. */
async function rest(size) {
  const server = await startRedis();
  const token = 'bench-token';
  const endpoint = await startRest({ redisPort: server.port, token });
  const entries = [];
  try {
    for (const spec of restStores) entries.push({ ...spec, store: await spec.create({ url: endpoint.url, token }) });
    for (const { store } of entries) await drive(store, size.restHits[256], 256);
    const samples = await widthRounds(entries, REST_WIDTHS, size.restHits, size.redisRounds);
    return REST_WIDTHS.map((width, w) =>
      redisTable(
        `rest-${width}`,
        `REST, ${width} in flight: the reference script over Upstash's REST protocol, through a test endpoint ` +
          '(scripts/rest-endpoint.js) on one redis-server (10,000 keys)',
        rows(entries, samples[w]),
      ),
    );
  } finally {
    for (const { store } of entries) await store?.close?.();
    await endpoint.stop();
    await server.stop();
  }
}

async function scriptLoad(port) {
  const Redis = require('ioredis');
  const client = new Redis({ host: '127.0.0.1', port });
  try {
    return await client.script('LOAD', REFERENCE_LUA);
  } finally {
    client.disconnect();
  }
}

/** A scenario's Markdown: its own, or the standard table. */
function render(t) {
  return t.markdown ?? table(t);
}

/** The issue's targets, checked against this run's medians. */
function targets(tables) {
  const byId = new Map(tables.map((t) => [t.id, t]));
  const value = (id, store, measure) => byId.get(id)?.rows.find((row) => row.store === store)?.values[measure]?.median;
  const lines = [];
  const check = (id, what, store, measure, test, { against, format = (r) => `${r.toFixed(2)}x` } = {}) => {
    const t = byId.get(id);
    if (!t) return;
    const mine = value(id, store, measure);
    // `against`: the best JS peer when absent, a row's name, or a number (an absolute target).
    const base =
      against === undefined
        ? bestPeer(t, measure).best
        : typeof against === 'number'
          ? against
          : value(id, against, measure);
    if (mine === undefined || !Number.isFinite(base)) {
      lines.push(`- ${what}: not measured in this build`);
      return;
    }
    const r = mine / base;
    lines.push(`- ${what}: ${format(r)}, ${test(r) ? 'met' : 'MISSED'}`);
  };
  const store = 'memoryStore()';
  check('seq', 'memoryStore sequential throughput >= 1.0x', store, 'ops/s', (r) => r >= 1);
  const fresh = 'ops/s, key built per hit';
  check('seq', 'memoryStore sequential throughput, key built per hit, >= 1.0x', store, fresh, (r) => r >= 1);
  check('inflight', 'memoryStore 100-in-flight throughput >= 1.0x', store, 'ops/s 100', (r) => r >= 1);
  const fresh100 = 'ops/s 100, key built per hit';
  check('inflight', 'memoryStore 100-in-flight throughput, key built per hit, >= 1.0x', store, fresh100, (r) => r >= 1);
  check('footprint', 'memoryStore bytes per counter <= 0.2x', store, 'B/counter', (r) => r <= 0.2);
  check('stall', 'memoryStore worst stall <= 0.1x', store, 'max', (r) => r <= 0.1);
  const us = { format: (r) => `${r.toFixed(0)} us` };
  check('stall', 'memoryStore worst stall while it grows < 1 ms', store, 'max', (r) => r < 1000, { ...us, against: 1 });
  check('stall', 'memoryStore worst hit while a full store turns over < 1 ms', turnover.name, 'max', (r) => r < 1000, {
    ...us,
    against: 1,
  });
  const full = FULL_CASES.map((c) => c.label);
  check(
    'full',
    'memoryStore refused hit on a full store, p99 within 3x a hit with room',
    full[2],
    'p99',
    (r) => r <= 3,
    {
      against: full[0],
    },
  );
  check(
    'full',
    'memoryStore evicting hit on a full store, p99 within 3x a hit with room',
    full[1],
    'p99',
    (r) => r <= 3,
    {
      against: full[0],
    },
  );
  check(
    'full',
    'memoryStore refused hit, p50 within 3x the floor of a rejected hit (JS checks, no native call)',
    full[2],
    'p50',
    (r) => r <= 3,
    { against: full[3] },
  );
  check('redis-256', 'redisStore at 256 in flight >= 1.25x ops/s', 'redisStore()', 'ops/s', (r) => r >= 1.25);
  check(
    'cluster-256',
    'redisStore on a cluster at 256 in flight >= 1.25x ops/s',
    CLUSTER_STORE,
    'ops/s',
    (r) => r >= 1.25,
  );
  check(
    'redis-256',
    'redisStore at 256 in flight >= 75% of redis-benchmark -P 16',
    'redisStore()',
    'ops/s',
    (r) => r >= 0.75,
    {
      against: 'limit: redis-benchmark EVALSHA -P 16',
      format: (r) => `${(r * 100).toFixed(0)}%`,
    },
  );
  const cached = 'createLimiter over redisStore(), block cache (default)';
  for (const id of ['flood-1', 'flood-keys']) {
    check(id, `${id}: block cache refused checks/s >= memoryStore's`, cached, 'refused/s', (r) => r >= 1, {
      against: 'createLimiter over memoryStore()',
    });
  }
  check(
    'flood-keys',
    'flood-keys: Redis calls per key with the block cache <= 1.05 (one per key per window, and the checks in flight before its first refusal)',
    cached,
    'Redis calls per key',
    (r) => r <= 1.05,
    { against: 1, format: (r) => r.toFixed(3) },
  );
  for (const id of ['sqlite-1', 'sqlite-16', 'sqlite-256', 'sqlite-hot']) {
    check(id, `sqliteStore, ${id}: ops/s >= 2x the best JS store's`, 'sqliteStore()', 'ops/s', (r) => r >= 2);
  }
  if (byId.has('sqlite-256')) {
    const cpuOf = (id) => ({ ...byId.get(id), higherIsBetter: false });
    for (const id of ['sqlite-1', 'sqlite-16', 'sqlite-256', 'sqlite-hot']) {
      byId.set(`${id}-cpu`, cpuOf(id));
      check(
        `${id}-cpu`,
        `sqliteStore, ${id}: client CPU per hit <= 0.5x the best JS store's`,
        'sqliteStore()',
        'client us/hit',
        (r) => r <= 0.5,
      );
    }
  }
  if (byId.has('cpu')) lines.push(...cpuTargets(byId.get('cpu')));
  const p50 = byId.get('redis-1') && { ...byId.get('redis-1'), higherIsBetter: false };
  if (p50) {
    byId.set('redis-1-p50', p50);
    check(
      'redis-1-p50',
      'redisStore at 1 in flight: p50 no worse than the best peer',
      'redisStore()',
      'p50 us',
      (r) => r <= 1,
    );
  }
  return lines;
}

/** The version of ratestore (`.`) or of an installed package. */
function versionOf(name) {
  const root = join(__dirname, '..');
  const file = name === '.' ? join(root, 'package.json') : join(root, 'node_modules', name, 'package.json');
  return JSON.parse(readFileSync(file, 'utf8')).version;
}

function machine() {
  const cpus = os.cpus();
  return (
    `${cpus[0]?.model ?? 'unknown CPU'}, ${cpus.length} cores, ` +
    `${(os.totalmem() / 2 ** 30).toFixed(1)} GiB memory, ${os.type()} ${os.release()} ${os.arch()}`
  );
}

/**
 * `--runtime=bun` (or deno, node22, ...): runs this benchmark, with the other arguments, on that runtime
 * from runtimes/ (`npm ci --prefix runtimes` installs them), and answers its exit code.
 */
async function onRuntime(name, args) {
  const { installed } = require('../scripts/runtimes.js');
  const target = installed(name);
  // The flags a script runs with on that runtime (Deno's permissions), and global.gc.
  const gcFlag = target.name === 'deno' ? '--v8-flags=--expose-gc' : '--expose-gc';
  const child = spawn(target.path, [...target.args, gcFlag, __filename, ...args], { stdio: 'inherit' });
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve(signal ? 1 : (code ?? 1)));
  });
}

async function main() {
  const args = process.argv.slice(2);
  const runtimeArg = args.find((a) => a.startsWith('--runtime='));
  if (runtimeArg) {
    process.exitCode = await onRuntime(
      runtimeArg.slice('--runtime='.length),
      args.filter((a) => a !== runtimeArg),
    );
    return;
  }
  const mode = args.includes('--smoke') ? 'smoke' : args.includes('--quick') ? 'quick' : 'full';
  const onlyArg = args.find((a) => a.startsWith('--only='));
  const only = new Set(onlyArg ? onlyArg.slice('--only='.length).split(',') : SCENARIOS);
  for (const id of only)
    if (!SCENARIOS.includes(id)) throw new Error(`unknown scenario ${id}; the scenarios are ${SCENARIOS.join(', ')}`);
  const size = SIZES[mode];
  const started = performance.now();
  const notes = {};
  console.log(`ratestore benchmark (${mode}): ${machine()}; ${runtimeName()}\n`);

  const tables = [];
  const show = (list) => {
    for (const t of list) {
      tables.push(t);
      console.log(`${render(t)}\n`);
    }
  };
  if (only.has('seq') || only.has('inflight')) show(await throughput(size, only));
  if (only.has('footprint')) show(await footprint(size));
  if (only.has('stall')) show(await stall(size));
  if (only.has('full')) show(await full(size));
  if (only.has('workers')) show(await workers(size));
  if (only.has('redis')) show(await redis(size, notes));
  if (only.has('replica')) show(await replica(size));
  if (only.has('cluster')) show(await cluster(size));
  if (only.has('consume')) show(await consumeScenario(size));
  if (only.has('flood')) show(await flood(size, gc));
  if (only.has('rest')) show(await rest(size));
  if (only.has('cpu')) show([await cpu(mode)]);
  if (only.has('postgres')) show(await postgres(size.postgres, { keys: KEYS, gc, notes }));
  // better-sqlite3 (rate-limiter-flexible's row) is a V8 addon that Bun and Deno do not load.
  if (only.has('sqlite') && runtime.name === 'Node.js') show(await sqlite(size.sqlite, { keys: KEYS, gc, notes }));
  else if (only.has('sqlite'))
    console.log(`The SQLite scenario runs on Node.js only (better-sqlite3), not on ${runtime.name}.\n`);
  if (only.has('mysql')) show(await mysqlScenario(size.mysql, { keys: KEYS, gc, notes }));

  const verdicts = targets(tables);
  console.log(`Targets (${mode} run):\n${verdicts.join('\n')}\n`);
  const minutes = (performance.now() - started) / 60_000;
  console.log(`${tables.length} tables in ${minutes.toFixed(1)} min`);
  // Every run writes the text, so that a smoke run checks it too; only a full run keeps it.
  const text = results(tables, verdicts, notes, args, minutes);
  // RESULTS.md's generated part is the Node.js run: another runtime's full run is printed only.
  if (mode === 'full' && !onlyArg && runtime.name === 'Node.js') {
    writeFileSync(join(__dirname, 'RESULTS.md'), text + kept());
    console.log('written to benchmark/RESULTS.md');
  }
}

/** The part of RESULTS.md from KEPT on (measurements made by hand), which a new run keeps as it is. */
const KEPT = '<!-- kept by npm run bench: written by hand -->';
function kept() {
  const old = readFileSync(join(__dirname, 'RESULTS.md'), { encoding: 'utf8', flag: 'a+' });
  const at = old.indexOf(KEPT);
  return at < 0 ? '' : `\n${old.slice(at)}`;
}

function results(tables, verdicts, notes, args, minutes) {
  const peers = [
    'express-rate-limit',
    'rate-limiter-flexible',
    'ioredis',
    'redis',
    '@valkey/valkey-glide',
    '@upstash/redis',
    'pg',
    'postgres',
    'better-sqlite3',
    'mysql2',
  ];
  const command = ['npm run bench', ...(args.length ? ['--', ...args] : [])].join(' ');
  return [
    '# Benchmark results',
    '',
    `The last full run of \`${command}\` (${new Date().toISOString().slice(0, 10)}, ${minutes.toFixed(1)} min).`,
    'Medians over interleaved rounds after a warm-up, with the min-max range; the machine is shared and',
    'noisy, so ratios within the run are what count.',
    '',
    `- Machine: ${machine()}`,
    `- Versions: ${runtimeName()}, ratestore ${versionOf('.')}, ` +
      `${peers.map((p) => `${p} ${versionOf(p)}`).join(', ')}, redis-server ${notes.redisVersion ?? '-'}, ` +
      `PostgreSQL ${notes.postgresVersion ?? '-'}, SQLite (node:sqlite) ${notes.sqliteVersion ?? '-'}`,
    `- Command: \`${command}\`; the limit row: \`${notes.benchmarkCommand ?? '-'}\``,
    `- PostgreSQL's limit rows: \`${notes.pgbenchCommand ?? '-'}\` (upsert.sql below); its settings: ` +
      `${notes.postgresSettings ?? '-'}`,
    '',
    '## Targets',
    '',
    ...verdicts,
    '',
    ...tables.map((t) => `${render(t).replace(/^### /, '## ')}\n`),
    '## How it measures',
    '',
    '- Throughput: the same 10,000 key strings (`ratelimit:chat:ip:10.0.x.y`) are hit over and over. V8 caches a',
    "  string's hash, which favours the JS stores; memoryStore copies and hashes the key on every hit.",
    '- Footprint: RSS growth after forced GCs, less the growth of a run that only makes the keys; the V8 heap',
    '  column is the same difference for the JS heap alone.',
    '- Stall: wall time of each awaited hit in a fresh process. On a busy machine the scheduler takes the CPU',
    '  away for a tick now and then (4 ms here), which shows in the max of every store.',
    '- Full store: a fresh process per case fills a memoryStore with 1,000,000 keys (1-hour or 2-hour windows),',
    '  then times awaited hits of fresh keys; the floor row is a hit that JavaScript rejects before any native call.',
    '- Worker threads: each worker thread opens the same `memoryStore({ name })` and makes awaited hits; ops/s is',
    "  all their hits over the slowest thread's time.",
    '- Redis: one redis-server started by the benchmark (no persistence), one connection per store; the limit',
    '  row is redis-benchmark with its default 50 connections, each pipelining 16.',
    '- Redis with a replica: a primary and its replica started by the benchmark (no persistence, in sync before the',
    "  first round), one connection per store to the primary; the redis-server column is the primary's CPU.",
    '- Redis Cluster: six redis-server processes started by the benchmark (scripts/redis-cluster.js: 3 masters with',
    '  a replica each, on this one machine), one connection per master per store.',
    "- REST: the test endpoint of Upstash's REST protocol (scripts/rest-endpoint.js, a Node.js process of its own, one",
    '  connection to the redis-server) over http:// on loopback, so the rows compare the clients, not a network;',
    "  Upstash's service adds its network round trip and TLS to every request.",
    '- PostgreSQL: one cluster started by the benchmark (scripts/postgres-server.js, as the tests start theirs, but',
    "  with PostgreSQL's default durability: fsync and synchronous_commit on, so every hit's commit waits for its WAL",
    '  flush to the disk; the other settings are the defaults, as listed above). Each store has a table of its own in',
    "  seed 000's layout (rate-limiter-flexible its own layout), filled with an ended window of every key before the",
    '  rounds, so every measured hit updates a row. Each round gives each store and pgbench the same time per row',
    '  (2 s in a full run), in an order that turns round by round; ops/s is the hits that time made over it, p50, p99',
    "  and mean the hits' latencies; client CPU is this process's (process.cpuUsage, postgresStore's I/O thread",
    "  included) per hit, pgbench's its own; server CPU is every process of the cluster (the postmaster, its backends",
    '  and its background processes, and the backends that ended meanwhile, from /proc, in clock ticks) per hit. The',
    "  pools' sizes are their defaults (pg's Pool and postgres.js: up to 10 connections; postgresStore: one pipelined",
    "  connection), so the stores on a pool commit up to 10 hits at once and share the WAL flushes, where postgresStore's",
    '  connection commits one statement after another. The limit rows are pgbench running the same upsert in C with',
    '  1, 16 and 64 clients (2 on the hot key). The paced row runs each store in a process of its own serving the CPU',
    "  scenario's load generator at 500 hits/s, one at a time, for 2 s: what light traffic costs the process.",
    '',
    ...(notes.pgbenchScript
      ? ["pgbench's upsert.sql (the hot key's sets `k` to 1):", '', '```', notes.pgbenchScript.trim(), '```', '']
      : []),
    '## The stores and their adapters',
    '',
    'Each adapter gives a store the call shape `hit(key, windowMs, amount)` and passes its result through as it is.',
    '',
    ...[
      ...memoryStores,
      turnover,
      floor,
      ...redisStores,
      ...replicaStores,
      ...clusterStores,
      ...restStores,
      ...memoryConsumers,
      ...redisConsumers,
      ...flooders,
      ...postgresStores,
      ...sqliteStores,
      { name: 'limit: pgbench -M prepared -c C', about: pgbenchAbout },
    ].map((s) => `- ${s.name}: ${s.about}.`),
    '',
  ].join('\n');
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
