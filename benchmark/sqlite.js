'use strict';
// The SQLite scenario: a file on this host's disk, in WAL mode with synchronous=NORMAL for every store
// (a commit is in the WAL when the hit answers: it survives kill -9), one hit per call. sqliteStore()
// against rate-limiter-flexible's RateLimiterSQLite on better-sqlite3, and a store on Node's own
// node:sqlite running seed 001's upsert, interleaved round by round at 1, 16 and 256 in flight over
// 10,000 keys and at 256 on one hot key. Client CPU is this process's (process.cpuUsage: sqliteStore's
// thread included).

const { execFileSync } = require('node:child_process');
const { existsSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } = require('node:fs');
const os = require('node:os');
const { dirname, join } = require('node:path');
const { WINDOW_MS, inFlightRows, sqlColumns, driveFor, storeRound, runRounds, tableRows } = require('./sql.js');

const ROWS = inFlightRows('sqlite');
const COLUMNS = sqlColumns();

/** Seed 001's store: its bucket table and upsert, on node:sqlite (synchronous, on the JS thread). */
function seedStore(path) {
  const { DatabaseSync } = require('node:sqlite');
  const db = new DatabaseSync(path);
  db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 2000');
  db.exec('CREATE TABLE IF NOT EXISTS rate_buckets (id TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at INTEGER)');
  const upsert = db.prepare(
    `INSERT INTO rate_buckets (id, count, expires_at) VALUES (?, ?, ?)
     ON CONFLICT(id) DO UPDATE SET count = count + excluded.count RETURNING count`,
  );
  return {
    async hit(key, windowMs, amount) {
      const now = Date.now();
      const windowStart = Math.floor(now / windowMs) * windowMs;
      const row = upsert.get(`${key}:${windowStart}`, amount, now + windowMs * 2);
      return { count: Number(row.count), resetMs: windowStart + windowMs - now };
    },
    close: async () => db.close(),
  };
}

/**
 * better-sqlite3, built on first use. Its install script is denied in package.json's allowScripts: it
 * would fetch a prebuilt binary, then Node.js's headers, neither of which an offline machine reaches, so
 * `npm ci` would hang there. Here node-gyp (the copy npm ships) builds it once against the headers of the
 * Node.js that runs the benchmark (its `include/node`, beside `bin/`), and the build stays in node_modules.
 */
function betterSqlite() {
  buildBetterSqlite();
  return require('better-sqlite3');
}

/**
 * Builds better-sqlite3 where it is not built yet, or was built for another Node.js's ABI (a build made
 * by another major version would not load): `node benchmark/sqlite.js --build`, which build-if-needed.js
 * and .ci/run run beside the addon's release build.
 */
function buildBetterSqlite() {
  const dir = dirname(require.resolve('better-sqlite3/package.json'));
  const abi = join(dir, 'build', 'Release', 'node-abi.txt');
  const built =
    existsSync(join(dir, 'build', 'Release', 'better_sqlite3.node')) &&
    existsSync(abi) &&
    readFileSync(abi, 'utf8') === process.versions.modules;
  if (!built) {
    const nodedir = dirname(dirname(process.execPath));
    if (!existsSync(join(nodedir, 'include', 'node', 'node_api.h')))
      throw new Error(`better-sqlite3 needs Node.js's headers to build, and ${nodedir}/include/node has none`);
    const npm =
      process.env.npm_execpath || realpathSync(execFileSync('sh', ['-c', 'command -v npm']).toString().trim());
    const gyp = join(dirname(npm), '..', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
    console.error('benchmark: building better-sqlite3 (the SQLite peer) with node-gyp, once...');
    // npm run passes its own config down as npm_config_* variables, and a machine's npmrc may name another
    // Node.js's headers (nodedir=/usr for a system Node.js), which node-gyp would take over the flag: the
    // build gets this Node.js's headers alone.
    const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_config_nodedir$/i.test(name)));
    env.npm_config_nodedir = nodedir;
    execFileSync(process.execPath, [gyp, 'rebuild', '--release', '--jobs', 'max', `--nodedir=${nodedir}`], {
      cwd: dir,
      env,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    writeFileSync(abi, process.versions.modules);
  }
}

const sqliteStores = [
  {
    name: 'rate-limiter-flexible RateLimiterSQLite',
    about:
      '`penalty(key, amount)` of RateLimiterSQLite (storeType `better-sqlite3`, better-sqlite3 12: synchronous, on ' +
      "the JS thread) on a file of its own in WAL mode with synchronous=NORMAL: the library's own upsert in a " +
      "transaction, its expiry computed in JS, with no limit check, as RateLimiterRedis's row",
    peer: true,
    async create(path) {
      const Database = betterSqlite();
      const { RateLimiterSQLite } = require('rate-limiter-flexible');
      const db = new Database(path);
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = NORMAL');
      const limiter = await new Promise((resolve, reject) => {
        const made = new RateLimiterSQLite(
          {
            storeClient: db,
            storeType: 'better-sqlite3',
            tableName: 'bench_rlflx',
            points: Number.MAX_SAFE_INTEGER,
            duration: WINDOW_MS / 1000,
          },
          (error) => (error ? reject(error) : resolve(made)),
        );
      });
      return {
        hit: async (key, _windowMs, amount) => {
          const r = await limiter.penalty(key, amount);
          return { count: r.consumedPoints, resetMs: r.msBeforeNext };
        },
        close: async () => db.close(),
      };
    },
  },
  {
    name: "node:sqlite, seed 001's upsert",
    about:
      "seed 001's bucket table and upsert (`INSERT ... ON CONFLICT(id) DO UPDATE SET count = count + ? RETURNING " +
      "count`, one prepared statement, the bucket id `key:windowStart`) on Node's own `node:sqlite` " +
      '(DatabaseSync: synchronous, on the JS thread), a file of its own in WAL mode with synchronous=NORMAL',
    peer: true,
    create: async (path) => seedStore(path),
  },
  {
    name: 'sqliteStore()',
    about:
      "ratestore's sqliteStore on a file of its own (its defaults: WAL, synchronous=NORMAL): the calls queued while " +
      'a transaction runs go into the next one, on its own thread',
    create: async (path) => require('../index.js').sqliteStore({ path, sweepIntervalMs: 0 }),
  },
];

/** The scenario. `size`: { rounds, seconds (per store, row and round), warmSeconds }. Answers one table per row. */
async function sqlite(size, { keys, gc, notes }) {
  const dir = mkdtempSync(join(os.tmpdir(), 'ratestore-bench-sqlite-'));
  const entries = [];
  try {
    notes.sqliteVersion = require('node:sqlite').DatabaseSync
      ? new (require('node:sqlite').DatabaseSync)(':memory:').prepare('SELECT sqlite_version() AS v').get().v
      : '-';
    for (const [i, spec] of sqliteStores.entries()) {
      entries.push({ ...spec, store: await spec.create(join(dir, `store${i}.sqlite3`)), samples: {} });
    }
    // Every key's row exists before the rounds: each measured hit updates one.
    for (const entry of entries) await driveFor(entry.store, keys, 256, size.warmSeconds * 1000, false);
    await runRounds('sqlite', size.rounds, ROWS, entries, (entry, row) =>
      storeRound('sqlite', entry, row, keys, size.seconds * 1000, gc),
    );
    return ROWS.map((row) => ({
      id: row.id,
      title:
        `SQLite, ${row.label}: a file on this host in WAL mode, synchronous=NORMAL, one hit per call` +
        `${row.hot ? '' : ', 10,000 keys'}`,
      unit: 'ops/s; latency in us per hit; CPU in us per hit (user + system, this process)',
      higherIsBetter: true,
      ratioOf: 'ops/s',
      columns: COLUMNS,
      rows: tableRows(entries, row),
    }));
  } finally {
    for (const entry of entries) await entry.store?.close?.().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  }
}

module.exports = { sqlite, sqliteStores };

if (require.main === module && process.argv.includes('--build')) buildBetterSqlite();
