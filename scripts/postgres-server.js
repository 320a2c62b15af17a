'use strict';
// A throwaway PostgreSQL cluster for the tests and the benchmark: initdb in a
// temp dir, a free loopback port, password auth on 127.0.0.1 only, stopped
// (and removed) afterwards. As root, the server and its files belong to the
// postgres system user (the server refuses to run as root).
//
// The tests' server trades durability for speed (fsync=off,
// synchronous_commit=off); `durable: true` keeps PostgreSQL's defaults, each
// commit flushed to the WAL on disk, as the benchmark measures it.

const { execFile } = require('node:child_process');
const {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} = require('node:fs');
const { tmpdir, userInfo } = require('node:os');
const { join } = require('node:path');
const { freePort } = require('./free-port.js');

const PASSWORD = 'pw-marker-3c7a';

/** The newest /usr/lib/postgresql/VERSION/bin that holds initdb. */
function binDir() {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).sort((a, b) => Number(b) - Number(a)) : [];
  const found = versions.map((v) => join(root, v, 'bin')).find((dir) => existsSync(join(dir, 'initdb')));
  if (!found) {
    throw new Error(
      'PostgreSQL server binaries were not found under /usr/lib/postgresql/*/bin. The postgresStore tests run ' +
        'against a real PostgreSQL: install it with `apt-get install postgresql` (Debian/Ubuntu), or set ' +
        'TEST_DATABASE_URL to a database the tests may write to.',
    );
  }
  return found;
}

function run(command, args, env = process.env) {
  return new Promise((resolve, reject) => {
    execFile(command, args, { env, timeout: 60_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} ${args[0] ?? ''} failed: ${stderr || error.message}`)) : resolve(stdout),
    );
  });
}

/** The postgres system user's uid and gid. */
async function postgresUserIds() {
  const uid = Number((await run('id', ['-u', 'postgres'])).trim());
  const gid = Number((await run('id', ['-g', 'postgres'])).trim());
  return [uid, gid];
}

function psql(bin, port, statement, host = '127.0.0.1') {
  const env = { ...process.env, PGPASSWORD: PASSWORD };
  const args = ['-h', host, '-p', String(port), '-U', 'postgres', '-d', 'postgres', '-AtXq'];
  return run(join(bin, 'psql'), [...args, '-v', 'ON_ERROR_STOP=1', '-c', statement], env).then((s) => s.trim());
}

/**
 * Starts a cluster. Options: `tls` ({ cert, key } PEM files: ssl=on, TLS connections only), `durable`
 * (PostgreSQL's default fsync and synchronous_commit; else both off), `settings` (more `-c name=value`),
 * `host` (the loopback address it listens on, default 127.0.0.1) and `port` (default a free one).
 */
async function startPostgres(settings = {}) {
  const bin = binDir();
  const root = userInfo().uid === 0;
  const as = (command, args) =>
    root ? run('runuser', ['-u', 'postgres', '--', join(bin, command), ...args]) : run(join(bin, command), args);
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-pg-'));
  const data = join(dir, 'data');
  const pwfile = join(dir, 'pw');
  writeFileSync(pwfile, PASSWORD + '\n');
  if (root) {
    const [uid, gid] = await postgresUserIds();
    chownSync(dir, uid, gid);
    chownSync(pwfile, uid, gid);
  }
  chmodSync(dir, 0o700);
  await as('initdb', ['-D', data, '-U', 'postgres', '--auth=scram-sha-256', `--pwfile=${pwfile}`, '-E', 'UTF8']);
  const host = settings.host ?? '127.0.0.1';
  if (!/^127\.\d+\.\d+\.\d+$/.test(host)) throw new Error(`a test server listens on loopback only, not ${host}`);
  const port = settings.port ?? (await freePort());
  let options = `-p ${port} -k ${dir} -c listen_addresses=${host}`;
  if (host !== '127.0.0.1') {
    // Logins from any loopback address, as from 127.0.0.1.
    const hba = join(data, 'pg_hba.conf');
    writeFileSync(hba, `${readFileSync(hba, 'utf8')}host all all 127.0.0.0/8 scram-sha-256\n`);
  }
  if (!settings.durable) options += ' -c fsync=off -c synchronous_commit=off';
  for (const [name, value] of Object.entries(settings.settings ?? {})) options += ` -c ${name}=${value}`;
  if (settings.tls) {
    // The server reads its key only when the key is its own and private to it.
    const cert = join(dir, 'server.crt');
    const key = join(dir, 'server.key');
    copyFileSync(settings.tls.cert, cert);
    copyFileSync(settings.tls.key, key);
    chmodSync(key, 0o600);
    if (root) {
      const [uid, gid] = await postgresUserIds();
      chownSync(cert, uid, gid);
      chownSync(key, uid, gid);
    }
    options += ` -c ssl=on -c ssl_cert_file=${cert} -c ssl_key_file=${key}`;
    // TCP connections over TLS only: `host` lines become `hostssl`.
    const hba = join(data, 'pg_hba.conf');
    writeFileSync(hba, readFileSync(hba, 'utf8').replace(/^host(\s)/gm, 'hostssl$1'));
  }
  const log = join(dir, 'log');
  const start = () => as('pg_ctl', ['start', '-D', data, '-w', '-l', log, '-o', options]).then(() => undefined);
  const halt = () => as('pg_ctl', ['stop', '-D', data, '-w', '-m', 'fast']).then(() => undefined);
  await start();
  const url = `postgres://postgres:${PASSWORD}@${host}:${port}/postgres`;
  return {
    url,
    port,
    dataDir: data,
    bin,
    /** The postmaster's pid, from postmaster.pid's first line (while it runs). */
    pid: () => Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0]),
    sql: (statement) => psql(bin, port, statement, host),
    restart: () =>
      as('pg_ctl', ['restart', '-D', data, '-w', '-m', 'fast', '-l', log, '-o', options]).then(() => undefined),
    halt,
    start,
    async stop() {
      await halt().catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

module.exports = { PASSWORD, binDir, postgresUserIds, startPostgres };
