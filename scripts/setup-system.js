'use strict';
// What the test commands need from the system, checked before anything runs:
// `node scripts/setup-system.js [test] [valgrind] [runtimes]` (default `test`,
// what `npm test` needs; `npm run test:valgrind` asks for `valgrind`,
// `npm run test:runtimes` for `runtimes`, .ci/run for all three).
//
// What is missing is installed with apt-get (Debian's packages) as root, or
// with passwordless sudo (`sudo -n`), after `apt-get update`. Where that is
// not possible (no apt-get, neither root nor passwordless sudo, or
// RATESTORE_NO_INSTALL=1), it stops with one message that lists everything
// missing and the one command that installs it all, and exits 1, so that no
// suite runs (and none is skipped) on a machine that lacks what it starts.
//
// Only Node.js built-ins: .ci/run calls it before `npm ci`.

const { spawnSync } = require('node:child_process');
const { accessSync, constants, existsSync, readFileSync, readdirSync } = require('node:fs');
const { delimiter, join } = require('node:path');

/** Where an executable `name` is: the first directory of PATH, then of `extra`, that has it. */
function which(name, extra = []) {
  const dirs = [...(process.env.PATH ?? '').split(delimiter).filter(Boolean), ...extra];
  for (const dir of dirs) {
    const path = join(dir, name);
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // not in this one
    }
  }
  return undefined;
}

/** PostgreSQL's server binaries, as scripts/postgres-server.js finds them: the newest /usr/lib/postgresql/VERSION/bin. */
function postgresBin() {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).sort((a, b) => Number(b) - Number(a)) : [];
  const dir = versions.map((v) => join(root, v, 'bin')).find((d) => existsSync(join(d, 'initdb')));
  if (!dir) return undefined;
  return ['initdb', 'pg_ctl', 'postgres', 'psql', 'pgbench'].every((b) => existsSync(join(dir, b))) ? dir : undefined;
}

/** The postgres system user, which the server and PgBouncer run as when the tests run as root. */
function postgresUser() {
  // The package makes a local user; `id` also finds one from a directory service.
  try {
    if (/^postgres:/m.test(readFileSync('/etc/passwd', 'utf8'))) return 'postgres (/etc/passwd)';
  } catch {
    // no /etc/passwd
  }
  const id = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
  return id.status === 0 ? `postgres (uid ${id.stdout.trim()})` : undefined;
}

const asRoot = () => typeof process.getuid === 'function' && process.getuid() === 0;

/**
 * Every requirement, one row each. `name`: what the message lists. `package`: the Debian package that
 * provides it. `for`: the commands that need it (`test` is `npm test`, `valgrind` is
 * `npm run test:valgrind`, `runtimes` is `npm run test:runtimes`). `why`: which suite uses it. Then how
 * to find it, one of: `program` (a command the suites spawn by name, looked up on PATH; with
 * `sbin: true` also in /usr/sbin and /sbin, which a user's PATH may lack), `file` (an absolute path the
 * suites run) or `check` (answers where it is, or undefined). `when`, optional: it is needed only where
 * this answers true. A suite that starts a new program adds a row here.
 */
const REQUIREMENTS = [
  {
    name: 'redis-server',
    package: 'redis-server',
    for: ['test', 'valgrind', 'runtimes'],
    why: 'the redisStore suites, Cluster and Sentinel, the Next.js end-to-end test, the valgrind scenarios',
    program: 'redis-server',
  },
  {
    name: 'redis-cli',
    package: 'redis-tools',
    for: ['test', 'runtimes'],
    why: 'the Redis suites configure and fault their servers with it (Cluster set-up, DEBUG SLEEP, ...)',
    program: 'redis-cli',
  },
  {
    name: 'openssl',
    package: 'openssl',
    for: ['test', 'runtimes'],
    why: 'the TLS suites (rediss://, PostgreSQL over TLS) make their certificates with it',
    program: 'openssl',
  },
  {
    name: 'PostgreSQL server binaries (/usr/lib/postgresql/*/bin: initdb, pg_ctl, postgres, psql, pgbench)',
    package: 'postgresql',
    for: ['test', 'runtimes'],
    why: 'the postgresStore suites run a throwaway cluster (scripts/postgres-server.js); the benchmark smoke runs pgbench',
    check: postgresBin,
  },
  {
    name: 'the postgres system user',
    package: 'postgresql',
    for: ['test', 'runtimes'],
    why: 'as root, PostgreSQL and PgBouncer run as this user (both refuse to run as root)',
    check: postgresUser,
    when: asRoot,
  },
  {
    name: 'runuser',
    package: 'util-linux',
    for: ['test', 'runtimes'],
    why: 'as root, starts PostgreSQL and PgBouncer as the postgres user',
    program: 'runuser',
    when: asRoot,
  },
  {
    name: 'pgbouncer (/usr/sbin/pgbouncer)',
    package: 'pgbouncer',
    for: ['test'],
    why: 'postgresStore through a real PgBouncer in transaction mode',
    file: '/usr/sbin/pgbouncer',
  },
  {
    name: 'unshare',
    package: 'util-linux',
    for: ['test'],
    why: 'postgresStore follows DNS that moves: a child process with its own /etc/hosts in a mount namespace',
    program: 'unshare',
  },
  {
    name: 'mount',
    package: 'mount',
    for: ['test'],
    why: 'the same test bind-mounts its /etc/hosts',
    program: 'mount',
  },
  {
    name: 'mariadbd',
    package: 'mariadb-server',
    for: ['test'],
    why: 'the mysqlStore suite runs a throwaway MariaDB server',
    program: 'mariadbd',
    sbin: true,
  },
  {
    name: 'mariadb-install-db',
    package: 'mariadb-server',
    for: ['test'],
    why: "makes the throwaway MariaDB server's data directory",
    program: 'mariadb-install-db',
  },
  {
    name: 'python3',
    package: 'python3',
    for: ['test'],
    why: "the benchmark smoke's load generator (benchmark/load.py), and node-gyp's build of better-sqlite3 (the SQLite peer)",
    program: 'python3',
  },
  {
    name: 'make',
    package: 'make',
    for: ['test'],
    why: "node-gyp's build of better-sqlite3, the benchmark's SQLite peer",
    program: 'make',
  },
  {
    name: 'g++',
    package: 'g++',
    for: ['test'],
    why: "node-gyp's build of better-sqlite3, the benchmark's SQLite peer",
    program: 'g++',
  },
  {
    name: 'tar',
    package: 'tar',
    for: ['test'],
    why: 'the package end-to-end test and the release dry run list the packed tarballs',
    program: 'tar',
  },
  {
    name: 'valgrind',
    package: 'valgrind',
    for: ['valgrind'],
    why: 'the native-safety scenarios run under memcheck',
    program: 'valgrind',
  },
];

const SBIN = ['/usr/sbin', '/sbin', '/usr/local/sbin'];

/** Where requirement `r` is on this machine, or undefined. */
function find(r) {
  if (r.program) return which(r.program, r.sbin ? SBIN : []);
  if (r.file) return existsSync(r.file) ? r.file : undefined;
  return r.check();
}

const COMMANDS = { test: 'npm test', valgrind: 'npm run test:valgrind', runtimes: 'npm run test:runtimes' };

/** The requirements of `scopes` that are missing. */
function missing(scopes) {
  return REQUIREMENTS.filter((r) => r.for.some((s) => scopes.includes(s)))
    .filter((r) => !r.when || r.when())
    .filter((r) => !find(r));
}

const packagesOf = (rows) => [...new Set(rows.map((r) => r.package))];

/** The command that installs `packages`, for the message. */
function installCommand(packages) {
  const sudo = asRoot() ? '' : 'sudo ';
  return `${sudo}apt-get update && ${sudo}apt-get install -y ${packages.join(' ')}`;
}

/** Whether this process can mount: root, or passwordless sudo. */
function privileged() {
  if (asRoot()) return true;
  return which('sudo') !== undefined && spawnSync('sudo', ['-n', 'true'], { stdio: 'ignore' }).status === 0;
}

/** How this process can run apt-get (`{ argv }`), or why it cannot (`{ reason }`). */
function installer() {
  if (process.env.RATESTORE_NO_INSTALL === '1') return { reason: 'RATESTORE_NO_INSTALL=1 forbids installing' };
  if (!which('apt-get')) return { reason: 'apt-get was not found on PATH (Debian and Ubuntu have it)' };
  if (asRoot()) return { argv: [] };
  if (!which('sudo')) return { reason: 'not root, and sudo was not found on PATH' };
  if (spawnSync('sudo', ['-n', 'true'], { stdio: 'ignore' }).status !== 0) {
    return { reason: 'not root, and sudo asks for a password (only `sudo -n` is tried)' };
  }
  return { argv: ['sudo', '-n'] };
}

function apt(prefix, args) {
  // sudo passes on only the variables it is told to: `env` sets DEBIAN_FRONTEND under it.
  const argv = [...prefix, 'env', 'DEBIAN_FRONTEND=noninteractive', 'apt-get', ...args];
  return spawnSync(argv[0], argv.slice(1), { stdio: ['ignore', 'inherit', 'inherit'] }).status === 0;
}

function report(scopes, rows, reason) {
  const wanted = scopes.map((s) => COMMANDS[s]).join(', ');
  const width = Math.max(...rows.map((r) => r.name.length));
  const lines = [
    `ratestore: ${wanted} cannot run: this machine lacks what the suites start (nothing was run).`,
    'Missing:',
    ...rows.map((r) => `  ${r.name.padEnd(width)}  (Debian package ${r.package}: ${r.why})`),
    `Not installed here: ${reason}.`,
    'Install everything with:',
    `  ${installCommand(packagesOf(rows))}`,
  ];
  console.error(lines.join('\n'));
}

function main(argv) {
  const scopes = argv.length ? argv : ['test'];
  for (const s of scopes) {
    if (!COMMANDS[s]) {
      console.error(`setup-system: unknown command ${JSON.stringify(s)}; one of ${Object.keys(COMMANDS).join(', ')}`);
      return 2;
    }
  }
  if (scopes.includes('test') && !privileged()) {
    console.error(
      'ratestore: npm test cannot run: the sqliteStore fault tests mount a small tmpfs (a full disk) and a ' +
        'read-only bind mount, which needs root or passwordless sudo (`sudo -n true` must succeed); nothing was run.',
    );
    return 1;
  }
  let rows = missing(scopes);
  if (rows.length === 0) return 0;
  const how = installer();
  if (how.reason) {
    report(scopes, rows, how.reason);
    return 1;
  }
  const packages = packagesOf(rows);
  console.error(`ratestore: installing what the suites need from the system: ${packages.join(' ')}`);
  const ok =
    apt(how.argv, ['update', '-qq']) && apt(how.argv, ['install', '-y', '-qq', '--no-install-recommends', ...packages]);
  rows = missing(scopes);
  if (rows.length === 0) return 0;
  report(scopes, rows, ok ? 'apt-get installed the packages, but these are still missing' : 'apt-get failed');
  return 1;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));

module.exports = { REQUIREMENTS, missing, installCommand };
