'use strict';
// A throwaway MariaDB server for the tests and the benchmark: mariadb-install-db into a temp dir,
// mariadbd on a free loopback port with its own socket and pid file (never the machine's own server or
// its config: --no-defaults), a database and a user with rights on it alone (so that read_only binds
// it), stopped (and removed) afterwards. As root, it runs as root (--user=root); its files stay in the
// temp dir.

const { execFile, spawn } = require('node:child_process');
const { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { delimiter, join } = require('node:path');
const { freePort } = require('./free-port.js');

// Debian puts mariadbd in /usr/sbin, off a user's PATH; elsewhere it is looked up on PATH.
const MARIADBD =
  ['/usr/sbin', '/usr/local/sbin', '/sbin', ...(process.env.PATH ?? '').split(delimiter).filter(Boolean)]
    .map((dir) => join(dir, 'mariadbd'))
    .find(existsSync) ?? '/usr/sbin/mariadbd';
const PASSWORD = 'my-pw-marker-9b2e';
const USER = 'ratestore';
const DATABASE = 'ratestore';

function run(command, args, input) {
  return new Promise((resolve, reject) => {
    const child = execFile(command, args, { timeout: 60_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} failed: ${stderr || error.message}`)) : resolve(stdout),
    );
    if (input !== undefined) child.stdin.end(input);
  });
}

/**
 * Starts a server. Options: `settings` (more `--name=value` options for mariadbd), `durable` (InnoDB's
 * default flush at each commit; else innodb_flush_log_at_trx_commit=2, as the tests run), `port`.
 */
async function startMariadb(options = {}) {
  if (!existsSync(MARIADBD)) {
    throw new Error(
      `mariadbd was not found at ${MARIADBD}. The mysqlStore tests run against a real MariaDB: install it with ` +
        '`apt-get install mariadb-server` (Debian/Ubuntu; .ci/run does this where it is missing; the tests never ' +
        'use the machine-wide server).',
    );
  }
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-mariadb-'));
  const data = join(dir, 'data');
  const socket = join(dir, 'sock');
  // A temp dir of its own: a server starting removes the `#sql` files it finds in its tmpdir, so with
  // the machine's /tmp shared, one server's start could delete another's temp table mid-install.
  const tmp = join(dir, 'tmp');
  mkdirSync(tmp);
  const root = process.getuid?.() === 0;
  await run('mariadb-install-db', [
    '--no-defaults',
    `--datadir=${data}`,
    `--tmpdir=${tmp}`,
    ...(root ? ['--user=root'] : []),
    '--auth-root-authentication-method=normal',
    '--skip-test-db',
    '--skip-name-resolve',
  ]);
  const port = options.port ?? (await freePort());
  const args = [
    '--no-defaults',
    `--datadir=${data}`,
    `--tmpdir=${tmp}`,
    ...(root ? ['--user=root'] : []),
    `--port=${port}`,
    '--bind-address=127.0.0.1',
    `--socket=${socket}`,
    `--pid-file=${join(dir, 'pid')}`,
    `--log-error=${join(dir, 'error.log')}`,
    '--skip-name-resolve',
    '--skip-log-bin',
    '--innodb-buffer-pool-size=64M',
    '--max-connections=400',
    // The tests trade durability for speed, as the PostgreSQL tests do (fsync off): no flush at commit,
    // and tables in the system tablespace (a CREATE TABLE makes no file).
    ...(options.durable
      ? []
      : [
          '--innodb-flush-log-at-trx-commit=0',
          '--innodb-flush-method=nosync',
          '--innodb-doublewrite=0',
          '--innodb-file-per-table=0',
        ]),
    ...Object.entries(options.settings ?? {}).map(([name, value]) => `--${name}=${value}`),
  ];
  let child;
  const sql = (statement) =>
    run('mariadb', ['--no-defaults', '-S', socket, '-uroot', '-N', '-B', '-e', statement]).then((s) => s.trim());
  const start = async () => {
    child = spawn(MARIADBD, args, { stdio: 'ignore' });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    for (let i = 0; i < 300; i++) {
      if (child.exitCode !== null) break;
      if (existsSync(socket) && (await sql('SELECT 1').catch(() => '')) === '1') return;
      await new Promise((r) => setTimeout(r, 50));
    }
    child.kill('SIGKILL');
    await exited;
    const log = join(dir, 'error.log');
    throw new Error(`mariadbd did not start: ${existsSync(log) ? readFileSync(log, 'utf8').slice(-2000) : 'no log'}`);
  };
  const halt = async () => {
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await exited;
    clearTimeout(timer);
  };
  await start();
  await sql(
    `CREATE DATABASE ${DATABASE}; CREATE USER '${USER}'@'%' IDENTIFIED BY '${PASSWORD}'; ` +
      `GRANT ALL ON ${DATABASE}.* TO '${USER}'@'%'; GRANT PROCESS ON *.* TO '${USER}'@'%';`,
  );
  return {
    url: `mysql://${USER}:${PASSWORD}@127.0.0.1:${port}/${DATABASE}`,
    port,
    dataDir: data,
    socket,
    pid: () => child.pid,
    /** Runs SQL as root (in the store's database) and answers the tab-separated output, trimmed. */
    sql: (statement) => sql(`USE ${DATABASE}; ${statement}`),
    restart: async () => {
      await halt();
      await start();
    },
    halt,
    start,
    async stop() {
      await halt().catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

module.exports = { PASSWORD, USER, DATABASE, startMariadb };
