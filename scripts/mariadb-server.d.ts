/** The password of the `ratestore` user of every server startMariadb makes. */
export const PASSWORD: string;
export const USER: string;
export const DATABASE: string;

export interface MariadbServer {
  /** `mysql://ratestore:…@127.0.0.1:PORT/ratestore`: a user with rights on its database alone. */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  /** The server's Unix socket (root logs in there without a password). */
  readonly socket: string;
  /** The server's pid (while it runs). */
  pid(): number | undefined;
  /** Runs SQL as root in the store's database, answering its tab-separated output, trimmed. */
  sql(statement: string): Promise<string>;
  /** Stops the server and starts it again on the same port and data. */
  restart(): Promise<void>;
  halt(): Promise<void>;
  start(): Promise<void>;
  /** Stops the server and removes its directory. */
  stop(): Promise<void>;
}

export interface MariadbOptions {
  /** More mariadbd options, each passed as `--name=value`. */
  settings?: Record<string, string | number>;
  /** InnoDB's default flush at each commit (else no flush at commit, nosync, no doublewrite, no file per table). */
  durable?: boolean;
  port?: number;
}

/** A throwaway MariaDB: a temp data dir, a free loopback port, stopped and removed by stop(). */
export function startMariadb(options?: MariadbOptions): Promise<MariadbServer>;
