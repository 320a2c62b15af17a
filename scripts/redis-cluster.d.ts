export interface Cluster {
  /** The seed URLs, comma-separated: `redis://127.0.0.1:<port>,…`. */
  readonly url: string;
  readonly nodes: ReadonlyArray<{ readonly port: number; readonly pid: number }>;
  /** Runs redis-cli against the node on `port`; resolves its output, trimmed. */
  cli(port: number, ...args: string[]): Promise<string>;
  /** SIGKILLs the node on `port`. */
  kill(port: number): void;
  /** Sends a signal to the node on `port` (SIGSTOP, SIGCONT, …). */
  signal(port: number, signal: NodeJS.Signals): void;
  /** The port of the master serving `slot`, as the node on `askPort` sees it. */
  masterOf(slot: number, askPort?: number): Promise<number | undefined>;
  /** Polls `check` every 100 ms until it resolves true, for up to `ms` (default 20 s). */
  waitUntil(check: () => Promise<boolean>, what: string, ms?: number): Promise<void>;
  /** SIGKILLs every node and removes their directories. */
  stop(): Promise<void>;
}

/** With `tls` (PEM files), every port and the cluster bus speak TLS only, and `url` holds rediss:// URLs. */
export function startCluster(options?: {
  masters?: number;
  tls?: { cert: string; key: string; ca: string };
}): Promise<Cluster>;
export function slotOf(key: string): number;
