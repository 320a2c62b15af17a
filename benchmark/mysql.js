'use strict';
// The MySQL scenario: a fixed-window hit per call on a throwaway MariaDB (scripts/mariadb-server.js),
// mysqlStore beside rate-limiter-flexible's RateLimiterMySQL and mysql2 running the same statement
// mysqlStore runs (its procedure's CALL, one per hit, through a pool), interleaved round by round, at
// 1, 16 and 256 in flight over 10,000 keys and at 256 on one hot key. Server CPU is mariadbd's (every
// thread, /proc/PID/stat), client CPU this process's.
//
// `node benchmark/mysql.js [seconds] [rounds] [--durable]` runs it on its own and prints the tables.

const { startMariadb } = require('../scripts/mariadb-server.js');
const {
  WINDOW_MS,
  inFlightRows,
  sqlColumns,
  statFields,
  TICK_US,
  driveFor,
  storeRound,
  runRounds,
  tableRows,
} = require('./sql.js');

const ROWS = inFlightRows('mysql');
const COLUMNS = sqlColumns({ server: true });

function serverCpuUs(pid) {
  const f = statFields(pid);
  return (Number(f[11]) + Number(f[12])) * TICK_US;
}

const stores = [
  {
    name: 'mysqlStore()',
    async create(url) {
      const { mysqlStore } = require('..');
      const store = mysqlStore({ url, timeoutMs: 10_000 });
      await store.ping();
      return store;
    },
  },
  {
    name: "mysql2 pool, mysqlStore's CALL",
    about:
      "mysql2's promise Pool (up to 10 connections, its default) running the statement mysqlStore sends for a hit, " +
      '`CALL askdare_counters_fw_v1(0, ?, ?, ?, 0, 1)` with the key as a binary parameter, one per hit',
    peer: true,
    async create(url) {
      const mysql = require('mysql2/promise');
      const pool = mysql.createPool({ uri: url, connectionLimit: 10 });
      return {
        async hit(key, windowMs, amount) {
          const [sets] = await pool.query('CALL askdare_counters_fw_v1(0, ?, ?, ?, 0, 1)', [
            Buffer.from(key),
            windowMs,
            amount,
          ]);
          const row = sets[0][0];
          return { count: Number(row.r0), resetMs: Number(row.r1) };
        },
        close: () => pool.end(),
      };
    },
  },
  {
    name: 'rate-limiter-flexible RateLimiterMySQL',
    about:
      "`penalty(key, amount)` on mysql2's callback Pool (up to 10 connections): the library's own transaction " +
      '(BEGIN, its upsert, a SELECT, COMMIT: four round trips) on its own table, made before the rounds',
    peer: true,
    async create(url) {
      const mysql = require('mysql2');
      const { RateLimiterMySQL } = require('rate-limiter-flexible');
      const pool = mysql.createPool({ uri: url, connectionLimit: 10 });
      const limiter = await new Promise((resolve, reject) => {
        const made = new RateLimiterMySQL(
          {
            storeClient: pool,
            storeType: 'pool',
            dbName: 'ratestore',
            tableName: 'bench_rlflx',
            points: Number.MAX_SAFE_INTEGER,
            duration: WINDOW_MS / 1000,
          },
          (error) => (error ? reject(error) : resolve(made)),
        );
      });
      return {
        hit: (key, _windowMs, amount) => limiter.penalty(key, amount),
        close: () => new Promise((resolve) => pool.end(() => resolve())),
      };
    },
  },
];

/** The scenario: `size` { rounds, seconds, warmSeconds, durable }; answers one table per row. */
async function mysqlScenario(size, { keys, gc = () => undefined, notes = {} }) {
  const server = await startMariadb({ durable: size.durable });
  const pid = server.pid();
  const entries = [];
  try {
    notes.mysqlVersion = await server.sql('SELECT VERSION()');
    notes.mysqlSettings = await server.sql(
      "SELECT CONCAT('innodb_flush_log_at_trx_commit=', @@innodb_flush_log_at_trx_commit, ', innodb_buffer_pool_size=', @@innodb_buffer_pool_size, ', log_bin=', @@log_bin)",
    );
    for (const spec of stores) entries.push({ ...spec, store: await spec.create(server.url), samples: {} });
    for (const entry of entries) await driveFor(entry.store, keys, 256, size.warmSeconds * 1000, false);
    await runRounds('mysql', size.rounds, ROWS, entries, (entry, row) =>
      storeRound('mysql', entry, row, keys, size.seconds * 1000, gc, { serverCpuUs: () => serverCpuUs(pid) }),
    );
    return ROWS.map((row) => ({
      id: row.id,
      title:
        `MariaDB ${notes.mysqlVersion}, ${row.label}: a fixed-window hit per call` +
        `${row.hot ? '' : ', 10,000 keys'} (innodb_flush_log_at_trx_commit=${size.durable ? 1 : 0})`,
      unit: 'ops/s; latency in us per hit; CPU in us per hit (user + system)',
      higherIsBetter: true,
      ratioOf: 'ops/s',
      columns: COLUMNS,
      rows: tableRows(entries, row),
    }));
  } finally {
    for (const entry of entries) await entry.store?.close?.().catch(() => undefined);
    await server.stop();
  }
}

module.exports = { mysqlScenario, mysqlStores: stores };

if (require.main === module) {
  const [seconds = '2', rounds = '3'] = process.argv.slice(2).filter((a) => !a.startsWith('--'));
  const durable = process.argv.includes('--durable');
  const keys = Array.from({ length: 10_000 }, (_, i) => `user:${i}:203.0.113.${i % 256}`);
  mysqlScenario(
    { rounds: Number(rounds), seconds: Number(seconds), warmSeconds: 1, durable },
    { keys, gc: global.gc ?? (() => undefined) },
  ).then((tables) => {
    for (const t of tables) {
      console.log(`\n${t.title}`);
      for (const r of t.rows) {
        const v = (m) => (r.values[m] ? Math.round(r.values[m].median ?? r.values[m].value ?? 0) : '-');
        console.log(
          `  ${r.store.padEnd(42)} ${String(v('ops/s')).padStart(8)} ops/s  p50 ${v('p50 us')} us  p99 ${v('p99 us')} us  client ${v('client us/hit')} us/hit  server ${v('server us/hit')} us/hit  errors ${v('errors')}`,
        );
      }
    }
  });
}
