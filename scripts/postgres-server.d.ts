/** The password of the `postgres` user of every cluster startPostgres makes. */
export const PASSWORD: string;

/** The newest /usr/lib/postgresql/VERSION/bin that holds initdb; throws, saying how to install it, when none does. */
export function binDir(): string;

/** The postgres system user's uid and gid (the owner of the server's files when running as root). */
export function postgresUserIds(): Promise<[number, number]>;

export interface PostgresServer {
  readonly url: string;
  readonly port: number;
  /** The cluster's data directory (postmaster.pid names the server's process). */
  readonly dataDir: string;
  /** The directory of the server's binaries (pgbench, psql, ...). */
  readonly bin: string;
  /** The postmaster's pid, read from postmaster.pid (while the server runs). */
  pid(): number;
  /** Runs SQL through psql and answers its unaligned output, trimmed. */
  sql(statement: string): Promise<string>;
  /** `pg_ctl restart`, or only its stop / start halves. */
  restart(): Promise<void>;
  halt(): Promise<void>;
  start(): Promise<void>;
  /** Stops the server and removes its directory. */
  stop(): Promise<void>;
}

export interface PostgresOptions {
  /** Serves TLS (ssl=on) with this certificate and key (PEM files), and accepts only TLS connections. */
  tls?: { cert: string; key: string };
  /**
   * PostgreSQL's default durability (fsync and synchronous_commit on: each commit waits for its WAL
   * flush). Default false: both off, as the tests run.
   */
  durable?: boolean;
  /** More server settings, each passed as `-c name=value`. */
  settings?: Record<string, string | number>;
  /** The loopback address it listens on (default 127.0.0.1; any of 127.0.0.0/8 logs in). */
  host?: string;
  /** Its port (default a free one). */
  port?: number;
}

/** A throwaway cluster: initdb in a temp dir, a free loopback port, password auth on 127.0.0.1 only. */
export function startPostgres(options?: PostgresOptions): Promise<PostgresServer>;
