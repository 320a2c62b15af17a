'use strict';
// The PostgreSQL scenario: seed 000's fixed-window upsert, one per hit, on a
// throwaway cluster with PostgreSQL's default durability (fsync and
// synchronous_commit on: every hit's commit waits for its WAL flush). The pg
// sketch of the seed, rate-limiter-flexible's RateLimiterPostgres, the
// `postgres` package and postgresStore run side by side, interleaved round by
// round, with pgbench running the same upsert as the limit; then a paced run
// shows what a store process spends on light traffic.

const { execFile } = require('node:child_process');
const { mkdtempSync, readdirSync, rmSync, writeFileSync } = require('node:fs');
const os = require('node:os');
const { join } = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const { startPostgres, PASSWORD } = require('../scripts/postgres-server.js');
const { postgresStores, seedTable, seedHit, WINDOW_MS } = require('./stores.js');
const { summary } = require('./stats.js');
const { sqlColumns, statFields, TICK_US, driveFor, push, storeRound, runRounds, tableRows } = require('./sql.js');
const { measure } = require('./cpu.js');

/** The measured rows: hits in flight (pgbench's clients for the same row), over 10,000 keys or one. */
const ROWS = [
  { id: 'postgres-1', width: 1, clients: 1, label: '1 in flight' },
  { id: 'postgres-16', width: 16, clients: 16, label: '16 in flight' },
  { id: 'postgres-256', width: 256, clients: 64, label: '256 in flight' },
  { id: 'postgres-hot', width: 256, clients: 2, label: '256 in flight on one hot key', hot: true },
];
const COLUMNS = sqlColumns({ mean: true, server: true });
/** The paced run: what a store process spends on each hit of light traffic. */
const PACED = { mode: 'steady', rate: 500, burst: 1 };
const PACED_STORES = ['postgresStore()', "pg Pool, seed 000's upsert", 'memoryStore()'];
const PGBENCH_TABLE = 'bench_pgbench';
/** pgbench's transaction: the seed's upsert of one key of 10,000 (`k1`...), its three values parameters. */
const pgbenchScript = (hot) =>
  [
    hot ? '\\set k 1' : '\\set k random(1, 10000)',
    '\\set amount 1',
    `\\set window_ms ${WINDOW_MS}`,
    seedHit(PGBENCH_TABLE)
      .trim()
      .replace('$1', "('k' || :k)")
      .replace('$2', ':amount')
      .replace('$3', ':window_ms')
      .replace(/\s+/g, ' ') + ';',
    '',
  ].join('\n');

/** The postmaster's children, as /proc sees them now. */
function children(postmaster) {
  const pids = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (Number(statFields(entry)[1]) === postmaster) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

function zombie(pid) {
  try {
    return statFields(pid)[0] === 'Z';
  } catch {
    return false;
  }
}

/**
 * CPU time of the whole cluster so far, in us: the postmaster's own and its reaped children's (backends
 * that ended meanwhile, as pgbench's do), and each live child's.
 */
function clusterCpuUs(postmaster) {
  const own = statFields(postmaster);
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14]);
  for (const pid of children(postmaster)) {
    try {
      const f = statFields(pid);
      ticks += Number(f[11]) + Number(f[12]);
    } catch {
      // ended between the listing and the read: its time is in the postmaster's reaped children's by now
    }
  }
  return ticks * TICK_US;
}

/** This process's reaped children's CPU time so far (pgbench's, once it has exited), in us. */
function childrenCpuUs() {
  const f = statFields('self');
  return (Number(f[13]) + Number(f[14])) * TICK_US;
}

/** pgbench's arguments: `-T seconds`, or with `transactions` (a smoke run's) `-t`, that many per client. */
function pgbenchArgs(server, file, clients, seconds, transactions) {
  const length = transactions ? ['-t', String(transactions)] : ['-T', String(seconds)];
  return ['-n', '-M', 'prepared', '-f', file, '-c', String(clients), '-j', '1', ...length].concat([
    '-h',
    '127.0.0.1',
    '-p',
    String(server.port),
    '-U',
    'postgres',
    'postgres',
  ]);
}

/** One pgbench run on one row: its tps, latency average and failures, and what it and the server spent. */
async function pgbenchRound(entry, row, server, files, length, postmaster) {
  // pgbench's -T counts its clients' connecting too: on a loaded machine 64 connections can take a whole
  // short round and leave no transaction, so such a round is run again, longer. (-t always runs its.)
  for (let tries = 1, { seconds } = length; ; tries++, seconds *= 2) {
    const ran = await pgbenchOnce(entry, row, server, files, { ...length, seconds }, postmaster, tries === 3);
    if (ran) return;
  }
}

async function pgbenchOnce(entry, row, server, files, { seconds, transactions }, postmaster, last) {
  const before = [clusterCpuUs(postmaster), childrenCpuUs()];
  const stdout = await new Promise((resolve, reject) => {
    execFile(
      join(server.bin, 'pgbench'),
      pgbenchArgs(server, files[row.hot ? 'hot' : 'keys'], row.clients, seconds, transactions),
      { env: { ...process.env, PGPASSWORD: PASSWORD }, timeout: (seconds + 60) * 1000 },
      (error, out, stderr) => (error ? reject(new Error(`pgbench failed: ${stderr || error.message}`)) : resolve(out)),
    );
  });
  // pgbench's backends end as it does: until the postmaster has reaped them (a zombie's /proc shows no
  // CPU time; the reaped one's is in the postmaster's), their time is in neither.
  for (let i = 0; i < 100 && children(postmaster).some(zombie); i++) await sleep(10);
  const serverUs = clusterCpuUs(postmaster) - before[0];
  const clientUs = childrenCpuUs() - before[1];
  const number = (pattern) => Number(pattern.exec(stdout)?.[1] ?? NaN);
  const tps = number(/tps = ([\d.]+) \(without initial connection time\)/);
  const hits = Math.max(number(/number of transactions actually processed: (\d+)/), 1);
  const failed = number(/number of failed transactions: (\d+)/);
  if (!Number.isFinite(tps) && !last && number(/number of transactions actually processed: (\d+)/) === 0) return false;
  if (!Number.isFinite(tps)) throw new Error(`pgbench printed no tps: ${stdout.slice(0, 400)}`);
  const samples = entry.samples[row.id];
  push(samples, 'ops/s', tps);
  push(samples, 'mean us', number(/latency average = ([\d.]+) ms/) * 1000);
  push(samples, 'client us/hit', clientUs / hits);
  push(samples, 'server us/hit', serverUs / hits);
  push(samples, 'errors', Number.isFinite(failed) ? failed : 0);
  return true;
}

/**
 * The scenario. `size`: { rounds, seconds (per store, row and round), warmSeconds, pacedSeconds, and in a
 * smoke run pgbenchTransactions (per client, for pgbench's whole-second -T) };
 * `keys`: the benchmark's 10,000 keys. Answers the tables: one per row, then the paced run.
 */
async function postgres(size, { keys, gc, notes }) {
  const server = await startPostgres({ durable: true });
  const postmaster = server.pid();
  const dir = mkdtempSync(join(os.tmpdir(), 'ratestore-pgbench-'));
  const entries = [];
  const seconds = Math.max(1, Math.round(size.seconds));
  const pgbenchRows = new Map(ROWS.map((row) => [row.id, `limit: pgbench -M prepared -c ${row.clients}`]));
  try {
    notes.postgresVersion = (await server.sql('SHOW server_version')).split(' ')[0];
    notes.postgresSettings = await server.sql(
      "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings WHERE name IN " +
        "('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'shared_buffers', 'max_connections')",
    );
    for (const spec of postgresStores) {
      entries.push({ ...spec, store: await spec.create(server.url), samples: {} });
    }
    // An ended window of every key in every table, pgbench's too: each measured hit updates a row.
    const { Client } = require('pg');
    const setup = new Client({ connectionString: server.url });
    await setup.connect();
    try {
      await setup.query(seedTable(PGBENCH_TABLE));
      const fill = (table) =>
        `INSERT INTO ${table} (key, total, reset_at) SELECT k, 0, now() FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING`;
      for (const entry of entries) await setup.query(entry.prefill ?? fill(entry.table), [keys]);
      const pgbenchKeys = Array.from({ length: 10_000 }, (_, i) => `k${i + 1}`);
      await setup.query(fill(PGBENCH_TABLE), [pgbenchKeys]);
      await setup.query('VACUUM ANALYZE');
      await setup.query('CHECKPOINT');
    } finally {
      await setup.end();
    }
    const files = { keys: join(dir, 'keys.sql'), hot: join(dir, 'hot.sql') };
    writeFileSync(files.keys, pgbenchScript(false));
    writeFileSync(files.hot, pgbenchScript(true));
    notes.pgbenchCommand = `pgbench ${pgbenchArgs({ port: 'PORT' }, 'upsert.sql', 'C', seconds).join(' ')}`;
    notes.pgbenchScript = pgbenchScript(false);
    // Every store at 256 in flight first: each pool opens all its connections before the rounds.
    for (const entry of entries) await driveFor(entry.store, keys, 256, size.warmSeconds * 1000, false);
    const pgbench = { name: 'pgbench', pgbench: true, samples: {} };
    const all = [...entries, pgbench];
    await runRounds('postgres', size.rounds, ROWS, all, (entry, row) =>
      entry.pgbench
        ? pgbenchRound(entry, row, server, files, { seconds, transactions: size.pgbenchTransactions }, postmaster)
        : storeRound('postgres', entry, row, keys, size.seconds * 1000, gc, {
            serverCpuUs: () => clusterCpuUs(postmaster),
            mean: true,
          }),
    );
    for (const entry of entries) await entry.store.close?.();
    entries.length = 0;
    const tables = ROWS.map((row) => ({
      id: row.id,
      title:
        `PostgreSQL, ${row.label}: seed 000's upsert, one per hit, on a server with default durability ` +
        `(fsync and synchronous_commit on)${row.hot ? '' : ', 10,000 keys'}`,
      unit: 'ops/s; latency in us per hit; CPU in us per hit (user + system)',
      higherIsBetter: true,
      ratioOf: 'ops/s',
      limit: pgbenchRows.get(row.id),
      columns: COLUMNS,
      rows: tableRows(all, row, (entry) => (entry.pgbench ? pgbenchRows.get(row.id) : entry.name)),
    }));
    tables.push(await paced(server, postmaster, size.pacedSeconds, dir));
    return tables;
  } finally {
    for (const entry of entries) await entry.store?.close?.().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
    await server.stop();
  }
}

/** Each of PACED_STORES in a store process of its own (benchmark/cpu-child.js), fed by benchmark/load.py. */
async function paced(server, postmaster, seconds, dir) {
  const target = { port: server.url, pids: () => [postmaster, ...children(postmaster)] };
  const rows = [];
  for (const name of PACED_STORES) {
    const r = await measure(name, target, PACED, seconds, dir);
    rows.push({
      store: name,
      peer: name === PACED_STORES[1],
      // One run each, as the CPU scenario's: a summary of one value.
      values: Object.fromEntries(
        Object.entries({
          'client us/hit': r.storeUsPerHit,
          user: r.storeUserUsPerHit,
          system: r.storeSystemUsPerHit,
          'client cores': r.storeCores,
          'server us/hit': name === 'memoryStore()' ? NaN : r.redisUsPerHit,
          'p50 us': r.p50,
          'p99 us': r.p99,
          'hits/s': r.rate,
          errors: r.errors,
        }).map(([measure, value]) => [measure, summary([value])]),
      ),
    });
  }
  return {
    id: 'postgres-paced',
    title:
      `PostgreSQL, paced: ${PACED.rate} hits/s steady, 1 at a time, to a store process from a load generator in ` +
      "another process (the CPU scenario's benchmark/load.py and cpu-child.js; memoryStore() is the floor: serving the requests)",
    unit:
      'us of CPU per hit, every thread of the store process (from /proc/PID/task/*/schedstat), split into user and ' +
      'system (from /proc/PID/stat, clock ticks: sampled); server: every process of the cluster; latency in us per hit as ' +
      'the generator saw it',
    higherIsBetter: false,
    ratioOf: 'client us/hit',
    columns: [
      { name: 'client us/hit', unit: 'us' },
      { name: 'user', unit: 'us' },
      { name: 'system', unit: 'us' },
      { name: 'client cores', unit: 'cores' },
      { name: 'server us/hit', unit: 'us' },
      { name: 'p50 us', unit: 'us' },
      { name: 'p99 us', unit: 'us' },
      { name: 'hits/s', unit: 'ops/s' },
      { name: 'errors', unit: 'count' },
    ],
    rows,
  };
}

/** What the pgbench rows run, for RESULTS.md. */
const pgbenchAbout =
  "pgbench (PostgreSQL's own load tool, in C, one thread: `-j 1`) running the seed's upsert as a prepared " +
  'statement (`-M prepared`), one hit per transaction, on a random key of 10,000 (`\\set k random(1, 10000)`; ' +
  "the hot key: `\\set k 1`) of a table of its own, for the time of one store's round, with 1, 16 and 64 clients " +
  'for the 1, 16 and 256 rows and 2 for the hot key; ops/s is its tps (connecting left out), mean us its latency ' +
  "average, client CPU pgbench's (this process's reaped children's, from /proc); its client and server CPU count its clients' logins (SCRAM)";

module.exports = { postgres, pgbenchAbout, PACED_STORES };
