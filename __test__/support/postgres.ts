// The postgresStore suites' servers: a throwaway PostgreSQL cluster (scripts/postgres-server.js), or
// TEST_DATABASE_URL in the plain suites (never in the fault tests, which restart the server); and a
// PgBouncer in front of a cluster.
import { execFile } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../scripts/free-port.js';
import { PASSWORD, postgresUserIds, startPostgres, type PostgresServer } from '../../scripts/postgres-server.js';

// The server itself is scripts/postgres-server.js's, shared with the benchmark; the tests run it with
// fsync and synchronous_commit off (its default).
export { PASSWORD, startPostgres };
export type { PostgresOptions, PostgresServer } from '../../scripts/postgres-server.js';

function run(command: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout: 60_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} ${args[0] ?? ''} failed: ${stderr || error.message}`)) : resolve(stdout),
    );
  });
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
    const [uid, gid] = await postgresUserIds();
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
