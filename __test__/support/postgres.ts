// A throwaway PostgreSQL cluster for the postgresStore suites: initdb in a temp dir, a free loopback
// port, password auth on 127.0.0.1 only, stopped (and removed) afterwards. TEST_DATABASE_URL, when set,
// replaces it in the plain suites (never in the fault tests, which restart the server).
import { execFile } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../scripts/free-port.js';

export const PASSWORD = 'pw-marker-3c7a';

function binDir(): string {
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

function run(command: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { env, timeout: 60_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} ${args[0] ?? ''} failed: ${stderr || error.message}`)) : resolve(stdout),
    );
  });
}

export interface PostgresServer {
  readonly url: string;
  readonly port: number;
  /** The cluster's data directory (postmaster.pid names the server's process). */
  readonly dataDir: string;
  /** Runs SQL through psql and answers its unaligned output, trimmed. */
  sql(statement: string): Promise<string>;
  /** `pg_ctl restart`, or only its stop / start halves. */
  restart(): Promise<void>;
  halt(): Promise<void>;
  start(): Promise<void>;
  stop(): Promise<void>;
}

export interface PostgresOptions {
  /** Serves TLS (ssl=on) with this certificate and key (PEM files), and accepts only TLS connections. */
  tls?: { cert: string; key: string };
}

export async function startPostgres(settings: PostgresOptions = {}): Promise<PostgresServer> {
  const bin = binDir();
  const root = userInfo().uid === 0;
  // The server refuses to run as root: then its files belong to the postgres system user.
  const as = (command: string, args: string[]) =>
    root ? run('runuser', ['-u', 'postgres', '--', join(bin, command), ...args]) : run(join(bin, command), args);
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-pg-'));
  const data = join(dir, 'data');
  const pwfile = join(dir, 'pw');
  writeFileSync(pwfile, PASSWORD + '\n');
  if (root) {
    const [uid, gid] = await ids();
    chownSync(dir, uid, gid);
    chownSync(pwfile, uid, gid);
  }
  chmodSync(dir, 0o700);
  await as('initdb', ['-D', data, '-U', 'postgres', '--auth=scram-sha-256', `--pwfile=${pwfile}`, '-E', 'UTF8']);
  const port = await freePort();
  let options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off`;
  if (settings.tls) {
    // The server reads its key only when the key is its own and private to it.
    const cert = join(dir, 'server.crt');
    const key = join(dir, 'server.key');
    copyFileSync(settings.tls.cert, cert);
    copyFileSync(settings.tls.key, key);
    chmodSync(key, 0o600);
    if (root) {
      const [uid, gid] = await ids();
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
  const url = `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`;
  return {
    url,
    port,
    dataDir: data,
    sql: (statement) => psql(bin, port, statement),
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

async function ids(): Promise<[number, number]> {
  const uid = Number((await run('id', ['-u', 'postgres'])).trim());
  const gid = Number((await run('id', ['-g', 'postgres'])).trim());
  return [uid, gid];
}

function psql(bin: string, port: number, statement: string): Promise<string> {
  const env = { ...process.env, PGPASSWORD: PASSWORD };
  const args = ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres', '-d', 'postgres', '-AtXq'];
  return run(join(bin, 'psql'), [...args, '-v', 'ON_ERROR_STOP=1', '-c', statement], env).then((s) => s.trim());
}

/** The server of the plain suites: TEST_DATABASE_URL's, else a throwaway one. */
export async function plainPostgres(): Promise<Pick<PostgresServer, 'url' | 'stop'>> {
  const url = process.env.TEST_DATABASE_URL;
  if (url) return { url, stop: async () => undefined };
  return startPostgres();
}

export interface Pgbouncer {
  /** The store's URL through PgBouncer (the server's user and password). */
  readonly url: string;
  readonly port: number;
  stop(): Promise<void>;
}

const PGBOUNCER = '/usr/sbin/pgbouncer';

/**
 * A real PgBouncer (Debian's package) on a free loopback port in front of `server`, in transaction mode
 * with `poolSize` server connections at most, SCRAM logins checked against a userlist in a temp dir.
 * As root it runs as the postgres user (it refuses to run as root), as the server does.
 */
export async function startPgbouncer(server: PostgresServer, poolSize = 2): Promise<Pgbouncer> {
  if (!existsSync(PGBOUNCER)) {
    throw new Error(
      `PgBouncer was not found at ${PGBOUNCER}. The pooler tests run postgresStore through a real PgBouncer: ` +
        'install it with `apt-get install pgbouncer` (Debian/Ubuntu; .ci/run does this where it is missing).',
    );
  }
  const root = userInfo().uid === 0;
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-pgbouncer-'));
  const port = await freePort();
  const pidfile = join(dir, 'pgbouncer.pid');
  const config = join(dir, 'pgbouncer.ini');
  const userlist = join(dir, 'userlist.txt');
  writeFileSync(userlist, `"postgres" "${PASSWORD}"\n`);
  writeFileSync(
    config,
    [
      '[databases]',
      `postgres = host=127.0.0.1 port=${server.port} dbname=postgres`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = scram-sha-256',
      `auth_file = ${userlist}`,
      'pool_mode = transaction',
      `default_pool_size = ${poolSize}`,
      'max_client_conn = 200',
      `logfile = ${join(dir, 'pgbouncer.log')}`,
      `pidfile = ${pidfile}`,
      '',
    ].join('\n'),
  );
  if (root) {
    const [uid, gid] = await ids();
    for (const file of [dir, config, userlist]) chownSync(file, uid, gid);
  }
  chmodSync(userlist, 0o600);
  // -d: it forks; the child writes its pidfile once it listens.
  await (root ? run('runuser', ['-u', 'postgres', '--', PGBOUNCER, '-d', config]) : run(PGBOUNCER, ['-d', config]));
  for (let i = 0; i < 250 && !existsSync(pidfile); i++) await new Promise((r) => setTimeout(r, 20));
  if (!existsSync(pidfile)) {
    const log = join(dir, 'pgbouncer.log');
    throw new Error(`pgbouncer did not start: ${existsSync(log) ? readFileSync(log, 'utf8') : 'no log'}`);
  }
  const pid = Number(readFileSync(pidfile, 'utf8').trim());
  return {
    url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`,
    port,
    async stop() {
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        // already gone
      }
      for (let i = 0; i < 100 && existsSync(pidfile); i++) await new Promise((r) => setTimeout(r, 20));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
