export interface RestStats {
  /** HTTP requests served (stats requests left out). */
  readonly requests: number;
  /** Of them, POSTs to /pipeline. */
  readonly pipelines: number;
  /** Redis commands run, in pipelines and alone. */
  readonly commands: number;
  /** Connections (TLS sessions over TLS) accepted. */
  readonly connections: number;
  /** Requests by HTTP version: `1.1`, `2.0`. */
  readonly httpVersions: Readonly<Record<string, number>>;
}

export interface RestEndpoint {
  /** `http://127.0.0.1:<port>`, or `https://` with TLS. */
  readonly url: string;
  /** The bearer token it takes. */
  readonly token: string;
  readonly port: number;
  readonly pid: number;
  /** Sends a signal to the endpoint's process: SIGKILL, SIGSTOP, SIGCONT. */
  signal(signal: NodeJS.Signals): void;
  /** Resolves once the endpoint's process has ended (after a SIGKILL, say). */
  exited(): Promise<void>;
  /** Starts the endpoint again on the same port (after SIGKILL). */
  restart(): Promise<void>;
  stats(): Promise<RestStats>;
  stop(): Promise<void>;
}

/** An endpoint of Upstash's REST protocol on a free loopback port, forwarding to the redis-server on `redisPort`. */
export function startRest(options: {
  redisPort: number;
  token: string;
  /** Serve HTTPS (HTTP/2 and HTTP/1.1) with these PEM files; `ca` is what `stats()` trusts. */
  tls?: { cert: string; key: string; ca: string };
}): Promise<RestEndpoint>;
