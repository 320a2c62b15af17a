/** The result of one hit. */
export interface CounterHit {
  /** The counter after this call's amount is added. A safe integer; may be negative after refunds. */
  readonly count: number;
  /** Whole milliseconds until the window ends: above 0, and at most `windowMs` for a window this call opened. */
  readonly resetMs: number;
}

/** Somewhere to keep fixed-window counters: the interface rate limiters and token budgets use. */
export interface RateLimitStore {
  /**
   * Adds `amount` to the counter of `key` atomically and returns the result.
   *
   * - No open window: a new counter at `amount`, ending `windowMs` from now.
   * - An open window: adds `amount`; the window keeps its end.
   * - `amount` 0 reads (with no open window: count 0, resetMs = windowMs, nothing opened).
   * - A negative `amount` refunds; the count is not clamped at 0.
   *
   * Rejects with a `TypeError`/`RangeError` for bad arguments (changing nothing), and with an
   * `Error` carrying a `code` when the store cannot do the hit. It never answers a made-up count.
   */
  hit(key: string, windowMs: number, amount: number): Promise<CounterHit>;
  /** Whether every server instance sees the same counters. */
  readonly shared: boolean;
  /** Ends the store, where it can be ended (ratestore's stores can); see {@link closeStore}. */
  close?(): Promise<void>;
}

/** Every `code` a ratestore error carries. */
export type RatestoreErrorCode =
  | 'ERR_INVALID_ARG_TYPE'
  | 'ERR_OUT_OF_RANGE'
  | 'ERR_COUNT_RANGE'
  | 'ERR_STORE_FULL'
  | 'ERR_STORE_NAME_CONFLICT'
  | 'ERR_CONFIG'
  | 'ERR_TIMEOUT'
  | 'ERR_CONNECTION'
  | 'ERR_AUTH'
  | 'ERR_REDIS'
  | 'ERR_POSTGRES'
  | 'ERR_MYSQL'
  | 'ERR_SQLITE'
  | 'ERR_CLOSED'
  | 'ERR_NOT_INITIALIZED'
  | 'ERR_INTERNAL'
  | 'ERR_UNSUPPORTED'
  | 'ERR_STORE_ANSWER';

/**
 * An error made by ratestore (an `Error`, `TypeError` or `RangeError`): its message starts with
 * `ratestore: ` and holds no key, URL password or token.
 */
export interface RatestoreError extends Error {
  readonly code: RatestoreErrorCode;
  /**
   * On `ERR_TIMEOUT` and `ERR_CONNECTION`: whether the call had left the process (see {@link RedisStoreError});
   * `false` on the `ERR_REDIS` of a call that met `NOSCRIPT` and was overtaken on its key (it did not run).
   */
  readonly sent?: boolean;
}

/** Whether `e` is an error ratestore made, so that a `catch (e: unknown)` can branch on `e.code`. */
export declare function isRatestoreError(e: unknown): e is RatestoreError;

/** Closes any store that has a `close()`; resolves at once for one that has none. */
export declare function closeStore(store: RateLimitStore): Promise<void>;

/** A redisStore's connection changing state, as `onError` receives it. */
export interface ConnectionEvent {
  readonly type: 'connected' | 'lost' | 'reconnected';
  /** For `lost`: the code the calls on that connection rejected with. */
  readonly code?: RatestoreErrorCode;
}

/** What every ratestore store counts (see `stats()`). */
export interface StoreStats {
  /** Calls that reached the store: every operation counts (a read, `ping()`, each of `reset(key)`'s three). */
  readonly calls: number;
  /** Calls that rejected, by code, of those that reached the store (bad arguments reject before). */
  readonly errors: Readonly<Partial<Record<RatestoreErrorCode, number>>>;
}

export interface MemoryStoreStats extends StoreStats {
  readonly kind: 'memory';
  /** Hits refused with `ERR_STORE_FULL`. */
  readonly refusals: number;
  /** Counters held now (ended windows not yet swept included), and the most held (`maxKeys`). */
  readonly held: number;
  readonly capacity: number;
  /** Counters dropped to make room: ended windows, and short windows before their end. */
  readonly evictions: { readonly ended: number; readonly short: number };
  /** Rounds of the sweeper over the table, and the ended windows it dropped. */
  readonly sweeps: number;
  readonly swept: number;
}

/** Latency of answered calls, in ms, over the store's life (an HDR-style histogram: within 1/16). */
export interface LatencyStats {
  readonly count: number;
  readonly sumMs: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly max: number;
}

export interface RedisStoreStats extends StoreStats {
  readonly kind: 'redis';
  /** Calls sent and not yet settled. */
  readonly inFlight: number;
  /** Connections opened (over REST: HTTP connections the pool opened). */
  readonly connects: number;
  /** Connections opened after one was lost (over REST: answers after a loss). */
  readonly reconnects: number;
  readonly connectFailures: number;
  readonly connectionLosses: number;
  /** Calls that timed out, sent or not. */
  readonly timeouts: number;
  /** Scripts sent again whole (EVAL) after NOSCRIPT. */
  readonly noscriptReloads: number;
  /** MOVED and ASK redirections followed (Redis Cluster). */
  readonly redirections: number;
  /**
   * Calls that ran on the master but that fewer replicas than `waitForReplicas` confirmed, or whose `WAIT`
   * Redis refused (they rejected `ERR_REDIS`, `sent: true`).
   */
  readonly unconfirmed: number;
  readonly latencyMs: LatencyStats;
}

/**
 * The Prometheus text exposition (format 0.0.4) of the stores' `stats()`, each labelled `store="<name>"`:
 * `ratestore_calls_total`, `ratestore_errors_total{code}`, `ratestore_call_latency_seconds` (a summary), ….
 */
export declare function metricsText(
  stores: Readonly<Record<string, { stats(): MemoryStoreStats | RedisStoreStats | SqliteStoreStats }>>,
): string;

/** Options of a limit-aware consume. */
export interface ConsumeOptions {
  /** Most cost units allowed per window: a safe integer, 0 or more. */
  limit: number;
  /**
   * Window length in milliseconds: a positive safe integer up to 4,503,599,627,370 (2^52 µs), as for
   * every limit-aware op (the sliding window's, a bucket's time to fill) on every store; past it the
   * call rejects with a `RangeError` and changes nothing.
   */
  windowMs: number;
  /** What this request costs: a safe integer, 0 or more. Default 1; 0 reads. */
  cost?: number;
}

/** The answer of a limit-aware consume (fixed or sliding window). */
export interface ConsumeResult {
  /** Whether the cost was taken. A refused consume changed nothing. */
  readonly allowed: boolean;
  /** The count after this call (the weighted estimate, for a sliding window). */
  readonly count: number;
  /** `limit - count`, kept between 0 and `limit`. */
  readonly remaining: number;
  /** Milliseconds until the current window ends. */
  readonly resetMs: number;
  /** 0 when allowed; else milliseconds until the same consume would pass with no other traffic. */
  readonly retryMs: number;
  /**
   * The window counted in, as an opaque id (a positive safe integer; 0 when a refused fixed-window
   * consume found none open): pass it to `refund`/`slidingWindow.decrement` as `{ window }` so that a
   * give-back returns to this window only.
   */
  readonly window: number;
}

/** Names the window a give-back returns to: the `window` its take answered. */
export interface GiveBackOptions {
  /** The id a consume (or a sliding increment) answered; omitted: whatever window is open now. */
  window?: number;
}

/** The answer of a sliding-window increment or decrement. */
export interface SlidingHit extends CounterHit {
  /** The current window, as an opaque id: what a decrement names to give back to it alone. */
  readonly window: number;
}

/** Options of a token bucket. */
export interface TokenBucketOptions {
  /** Most tokens the bucket holds: a positive safe integer. A new key starts full. */
  capacity: number;
  /** Tokens that come back every `intervalMs`, whole, up to `capacity`: a positive safe integer. */
  refill: number;
  /** Milliseconds between refills: a positive safe integer. */
  intervalMs: number;
  /** Tokens this request takes: a safe integer, 0 or more. Default 1; 0 reads. */
  cost?: number;
}

/** The answer of a token bucket. */
export interface TokenBucketResult {
  /** Whether the tokens were taken. A refused take changed nothing. */
  readonly allowed: boolean;
  /** Tokens left after this call. */
  readonly remaining: number;
  /** 0 when allowed; else milliseconds until `cost` tokens are in. */
  readonly retryMs: number;
  /** Milliseconds until the bucket is full again (0 when it is). */
  readonly resetMs: number;
}

/** A sliding window over one store (universal-rate-limit's): the previous window weighted by its share still inside. */
export interface SlidingWindow {
  /** Adds `amount` (default 1; 0 reads) with no limit; `count` is the estimate including it. */
  increment(key: string, windowMs: number, amount?: number): Promise<SlidingHit>;
  /**
   * Takes back up to `amount` (default 1); never below 0, never creates a state. With `{ window }`
   * only from that window: the current one, or the previous one once the clock has moved a window on;
   * any other window changes nothing. Without it: the current window first, then the previous one.
   */
  decrement(key: string, windowMs: number, amount?: number, options?: GiveBackOptions): Promise<SlidingHit>;
  /** Adds `cost` only if the estimate stays within `limit`; a refused consume changes nothing. */
  consume(key: string, options: ConsumeOptions): Promise<ConsumeResult>;
}

/**
 * What ratestore's own stores offer beyond the contract's `hit`: every operation one atomic step per
 * key (one lock, or one Lua script and one round trip), with the same answer from memoryStore,
 * redisStore and a Redis Cluster. Each algorithm keeps its own state under its own key (on Redis:
 * `prefix + key` for the fixed window, `+ ':sw'` for the sliding window, `+ ':tb'` for the token
 * bucket), so switching an app's algorithm never misreads a counter.
 */
export interface RatestoreStore extends RateLimitStore {
  /**
   * Fixed window, on `hit`'s counter: adds `cost` only if `count + cost <= limit`. A refused consume
   * costs one call and changes nothing; with no open window and `cost <= limit` it opens one.
   */
  consume(key: string, options: ConsumeOptions): Promise<ConsumeResult>;
  /**
   * Gives back up to `amount` (a safe integer, 0 or more) within the open fixed window, never below 0;
   * resolves `null`, changing nothing, when no window is open: a refund never opens a window. With
   * `{ window }` (the id its consume answered) it also changes nothing, and resolves `null`, when the
   * open window is another one: a late refund never takes from a window another request opened.
   */
  refund(key: string, amount: number, options?: GiveBackOptions): Promise<CounterHit | null>;
  /** The sliding-window algorithm over this store. */
  readonly slidingWindow: SlidingWindow;
  /** Takes `cost` tokens from the key's bucket if it holds them. */
  tokenBucket(key: string, options: TokenBucketOptions): Promise<TokenBucketResult>;
  /** Removes what every algorithm keeps for `key`. */
  reset(key: string): Promise<void>;
  /** Refuses later calls (they reject with `ERR_CLOSED`); resolves once the calls in flight have settled. */
  close(): Promise<void>;
  /**
   * Empties the store: memoryStore at once; redisStore every key under its prefix (SCAN and UNLINK in
   * batches, on every master of a cluster, never KEYS). Rejects with `ERR_CONFIG` when the prefix is
   * empty, since that would empty the whole database.
   */
  resetAll(): Promise<void>;
}

export interface MemoryStoreOptions {
  /** Most counters held at once. Default 1,000,000. */
  maxKeys?: number;
  /**
   * A process-wide store: every `memoryStore({ name })` with the same name, in any module or
   * worker thread of the process, sees the same counters (and survives dev-server reloads). Two
   * stores of one name with different `maxKeys` throw `ERR_STORE_NAME_CONFLICT`. The table is freed
   * when the last store of its name closes; a store collected without `close()` keeps it.
   */
  name?: string;
  /** Called with the error of each failed call (the one its promise rejects with). */
  onError?: (error: RatestoreError) => void;
}

/** The store `memoryStore()` returns. */
export interface MemoryStore extends RatestoreStore {
  readonly shared: false;
  /** Counters held now, including ended windows not yet swept. */
  readonly size: number;
  /** The table's figures (a named store's are every holder's) and this store's failures. */
  stats(): MemoryStoreStats;
  /** Refuses later calls (`ERR_CLOSED`); frees the table (a named one once its last holder closes). */
  close(): Promise<void>;
}

/**
 * Counters in this process, in Rust memory off the V8 heap. The embedded default: no server.
 *
 * When a new counter needs room and `maxKeys` are held, ended windows are dropped first, then the
 * soonest-ending windows of at most one hour. If only longer windows remain, the hit rejects with
 * an `Error` whose `code` is `ERR_STORE_FULL`.
 */
export declare function memoryStore(options?: MemoryStoreOptions): MemoryStore;

export interface RedisStoreOptions {
  /**
   * `redis://[[user]:password@]host[:port][/db]`, `rediss://…` (TLS), `redis+unix:///path/to/socket[?db=N]`,
   * or `https://…`: Upstash's REST API (`http://` only on a loopback address). Default: the `REDIS_URL`
   * environment variable, then `KV_URL`, `UPSTASH_REDIS_REST_URL`, `KV_REST_API_URL`, read on the first
   * hit. With `cluster`, one or more comma-separated seed node URLs (`redis://h1:7000,redis://h2:7001`).
   * Redis Sentinel: `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/name[?sentinelPassword=...]`
   * (the credentials are the master's; `sentinelPassword` the sentinels', with `sentinelUsername=...` beside it
   * for a sentinels' ACL user, in either order); each connect asks the sentinels where the master of `name` is. `rediss+sentinel://…`: TLS to the sentinels and to the master (whose
   * certificate must name the address the sentinels give, usually an IP), trusting `tls.ca` if given.
   * Over REST a key must be a well-formed string (no lone surrogate), or the call rejects with a `TypeError`.
   */
  url?: string;
  /**
   * The password (Upstash and Vercel call it a token), or the REST API's bearer token. Default: the
   * `REDIS_TOKEN` environment variable, else the password in the URL; with a REST URL first the token
   * variable beside its URL's (`UPSTASH_REDIS_REST_TOKEN`, `KV_REST_API_TOKEN`). Wins over a password in the URL.
   */
  token?: string;
  /** Prepended to every key, so that apps can share one database. Default `'askdare:'`. */
  prefix?: string;
  /**
   * Bound on one hit in milliseconds, connecting included; past it the hit rejects with `ERR_TIMEOUT`,
   * whose `sent` says whether the hit had been sent (then it may or may not have counted). Default 2,000.
   */
  timeoutMs?: number;
  /**
   * The URL names nodes of a Redis Cluster: the store learns the slot map from them and sends each hit to
   * the master of its key's slot, following MOVED and ASK redirections. Default: the `REDIS_CLUSTER`
   * environment variable (`1` or `true`), read on the first hit; else false.
   */
  cluster?: boolean;
  /**
   * How many replicas must have a call's writes before it is answered (Redis `WAIT n ms`, one out per
   * connection at a time, serving every call written before it; at most `timeoutMs / 2`). Set to every
   * replica the master has, a Sentinel failover keeps every count a call answered (fewer is not enough: a
   * replica not promoted confirms the old master's writes in the gap). A call the replicas did not confirm
   * in time, or whose `WAIT` Redis refused (the ACL user needs `wait`), rejects with `ERR_REDIS`,
   * `sent: true` (it counted on the master); `stats().unconfirmed` counts them. Costs a replica round trip
   * per `WAIT`; with fewer replicas up, every call rejects. One server or Sentinel only. Default 0: no wait.
   */
  waitForReplicas?: number;
  /** TLS settings for `rediss://`, `rediss+sentinel://` and `https://`. */
  tls?: {
    /** PEM certificate(s) to trust instead of the public roots: for a server with a private CA. */
    ca?: string;
  };
  /**
   * Called with the error of each failed call (the one its promise rejects with), and on the
   * connections' changes of state: `connected`, `lost` (with its code), `reconnected`, on one server, a
   * cluster (any node's connection) or over REST (the API's answers).
   */
  onError?: (event: RatestoreError | ConnectionEvent) => void;
}

/** The store `redisStore()` returns. */
export interface RedisStore extends RatestoreStore {
  readonly shared: true;
  /** One `PING` round trip (connecting first if need be); rejects with the codes a hit would. */
  ping(): Promise<void>;
  /** Opens the connection before the first hit: resolves once a `PING` through it is answered. */
  connect(): Promise<void>;
  /**
   * This store's calls and failures, and its connections' figures (shared by stores on the same connections;
   * what each figure counts on a cluster and over REST: README, "Figures, events, health and closing").
   */
  stats(): RedisStoreStats;
  /**
   * Refuses later hits (they reject with `ERR_CLOSED`) and ends the connection. Resolves once the hits in
   * flight have settled. An idle store never keeps the process alive, closed or not.
   */
  close(): Promise<void>;
}

/**
 * Counters in Redis, shared by every instance of an app: one Lua script per hit, pipelined on one
 * connection, opened on the first hit and shared by the stores of the process with the same settings
 * (URL, credentials, `tls.ca`, `cluster`, `timeoutMs`; the prefix plays no part). The environment is read
 * on the first hit too, never at import or construction, so a build with no credentials succeeds.
 *
 * A store that cannot do a hit rejects with a {@link RedisStoreError} whose `code` says why: `ERR_CONFIG`
 * (no URL, or a bad one), `ERR_CONNECTION`, `ERR_TIMEOUT`, `ERR_AUTH`, `ERR_REDIS` (another server error),
 * `ERR_CLOSED`; a count that would leave the safe-integer range rejects with a `RangeError`
 * (`ERR_COUNT_RANGE`). A hit that was sent is never sent again: after `ERR_TIMEOUT` or `ERR_CONNECTION`
 * with `sent: true` it may or may not have counted. No message holds a key, the URL's password or the token.
 *
 * Options of the wrong type throw a `TypeError` here; everything that depends on the URL is checked on
 * the first hit.
 */
export declare function redisStore(options?: RedisStoreOptions): RedisStore;

export interface PostgresStoreOptions {
  /**
   * `postgres://user:password@host:port/database[?sslmode=…]`. Default: the `DATABASE_URL` environment
   * variable, then `POSTGRES_URL`, read on the first call, never at import or construction. `sslmode`
   * is libpq's (see `sslmode` below); `sslrootcert=system` means the public roots (with `verify-full`
   * or `verify-ca`); a file in `sslrootcert` is not read (pass its PEM as `tls.ca`). pg's and Prisma's
   * `ssl`, `sslmode=no-verify`, `uselibpqcompat`, `pgbouncer`, `connection_limit`, `schema`,
   * `statement_cache_size`, `pool_timeout` and `socket_timeout` are accepted (README: "URL parameters").
   */
  url?: string;
  /**
   * TLS, overriding the URL's `sslmode`. `'disable'`: never; `'prefer'` (the default, as libpq's): TLS
   * when the server offers it; `'require'`: always; with neither of these two is the certificate checked
   * unless `tls.ca` is given (then its chain, not the host name). `'verify-ca'`: always, the chain checked
   * against `tls.ca` or the public roots; `'verify-full'`: the chain and the host name. TLS is rustls (ring).
   */
  sslmode?: 'disable' | 'prefer' | 'require' | 'verify-ca' | 'verify-full';
  /** `ca`: PEM certificates to trust instead of the public roots (a private CA). */
  tls?: { ca?: string };
  /**
   * The fixed window's table, in the layout of askdare's custom-store guide (`key text PRIMARY KEY, total bigint, reset_at
   * timestamptz`). Default `'askdare_counters'`. The sliding window's and the token bucket's states are
   * kept in `TABLE_sw` and `TABLE_tb`; the algorithms run as the functions `TABLE_fw_v1`, `TABLE_sw_v1`
   * and `TABLE_tb_v1` (at most 57 bytes, so that no name made from it is cut).
   */
  table?: string;
  /**
   * The table's schema. Default: the URL's `schema` parameter (Prisma's), else the schema where the
   * first connection's search_path finds the table (else `current_schema()`), named explicitly from then on.
   */
  schema?: string;
  /**
   * Bound on one call in milliseconds, connecting included; past it the call rejects with `ERR_TIMEOUT`,
   * whose `sent` says whether the call had been sent (then it may or may not have counted). A row another
   * session holds is waited for until just before it (the call then rejects, sent, counting nothing).
   * Default 2,000; at most 2^32 - 1.
   */
  timeoutMs?: number;
  /**
   * Create the tables and functions (`CREATE TABLE IF NOT EXISTS`, a function only where it is missing,
   * under an advisory lock) on each connection's first use. Default true; false: run docs/postgres.sql.
   */
  createTable?: boolean;
  /**
   * How often, in ms, the store deletes the rows that count nothing (ended windows, expired states),
   * 500 per statement, skipping rows a call holds, while it is open and connected. Default 60,000; 0:
   * never (then delete them from cron, docs/postgres.sql).
   */
  sweepIntervalMs?: number;
  /** Called with the error of each failed call (the one its promise rejects with). */
  onError?: (error: RatestoreError) => void;
}

export interface PostgresStoreStats {
  readonly kind: 'postgres';
  readonly calls: number;
  readonly errors: Readonly<Record<string, number>>;
  readonly inFlight: number;
  /** Rows the store's sweeper deleted (see `sweepIntervalMs`). */
  readonly swept: number;
}

/** The store `postgresStore()` returns. */
export interface PostgresStore extends RatestoreStore {
  readonly shared: true;
  /** One `SELECT 1` round trip (connecting, and creating the table, first if need be). */
  ping(): Promise<void>;
  /** Opens the connection before the first hit. */
  connect(): Promise<void>;
  stats(): PostgresStoreStats;
  close(): Promise<void>;
}

/**
 * Counters in PostgreSQL, on the database's clock: the fixed window in askdare's custom-store table, the sliding
 * window and the token bucket in two more tables, each call one statement on one pipelined connection,
 * answering as memoryStore and redisStore do. Rejects with `ERR_CONFIG`, `ERR_CONNECTION`, `ERR_TIMEOUT`,
 * `ERR_AUTH`, `ERR_POSTGRES` (another server error, with its SQLSTATE) or `ERR_CLOSED`, and a count past
 * the safe-integer range with a `RangeError` (`ERR_COUNT_RANGE`). `ERR_TIMEOUT` and `ERR_CONNECTION` carry
 * `sent`: false while connecting (the call did not count), true once it was handed to the connection (it
 * may or may not have counted; it is never sent again). A statement the server cancelled (its
 * `statement_timeout`, SQLSTATE 57014) is `ERR_TIMEOUT` with `sent` true: it was rolled back and counted
 * nothing. A read-only server (25006, e.g. a primary demoted by a failover) is `ERR_POSTGRES`, and the
 * next call connects anew. After a failed connect, calls reject at once (`sent` false, "backing off")
 * for a delay that doubles from 100 ms up to 5 s, then one call alone connects. No message holds a key,
 * the URL or its password.
 */
export declare function postgresStore(options?: PostgresStoreOptions): PostgresStore;

export interface SqliteStoreOptions {
  /**
   * The database file, created if missing (its folder must exist), resolved against the working directory
   * when the store is made. Default `'ratestore.sqlite3'` in the working directory. `':memory:'`: a
   * database of this store alone, gone when it closes (`shared` is then false).
   */
  path?: string;
  /**
   * Bound on one call in milliseconds: how long it may wait for another connection's write lock on the
   * file (SQLite's busy handler); past it the call rejects with `ERR_TIMEOUT`, `sent` false: it counted
   * nothing. Default 2,000.
   */
  timeoutMs?: number;
  /**
   * SQLite's `synchronous` in WAL mode. `'normal'` (the default): a call answers once its transaction is
   * in the WAL file, which survives the process's death (`kill -9`) but may lose the last commits to a
   * power loss or a kernel crash. `'full'`: each transaction is fsynced before its calls answer, which
   * survives those too, at one disk flush per batch.
   */
  synchronous?: 'normal' | 'full';
  /**
   * How often, in ms, the store deletes the rows that count nothing (ended windows, expired states), 500
   * rows looked at per short transaction, between batches of calls, while the file is open. Default
   * 60,000; 0: never.
   */
  sweepIntervalMs?: number;
  /** Called with the error of each failed call (the one its promise rejects with). */
  onError?: (error: RatestoreError) => void;
}

export interface SqliteStoreStats {
  readonly kind: 'sqlite';
  readonly calls: number;
  readonly errors: Readonly<Record<string, number>>;
  readonly inFlight: number;
  /** Transactions committed (each holds every call queued while the one before it ran). */
  readonly commits: number;
  /** Transactions that had to wait for another connection's lock on the file, and got it in time. */
  readonly busyWaits: number;
  /** Rows the store's sweeper deleted (see `sweepIntervalMs`). */
  readonly swept: number;
}

/** The store `sqliteStore()` returns. */
export interface SqliteStore extends RatestoreStore {
  /** True: every process of this host on the same file sees the same counters; false for `':memory:'`. */
  readonly shared: boolean;
  /** One write transaction on the file (opening it, and creating the table, first if need be). */
  ping(): Promise<void>;
  /** Opens the file before the first hit. */
  connect(): Promise<void>;
  stats(): SqliteStoreStats;
  close(): Promise<void>;
}

/**
 * Counters in a SQLite file (SQLite is compiled in), in WAL mode, on the host's wall clock, shared by every
 * process of the host that opens the same file, answering as memoryStore and redisStore do. Each store has
 * a thread of its own: the calls made while one transaction runs go into the next, one `BEGIN IMMEDIATE …
 * COMMIT`, and each is answered once that has committed. Rejects with `ERR_TIMEOUT` (another connection
 * kept the file locked past `timeoutMs`), `ERR_SQLITE` (the file is read-only, full, corrupt, not a
 * database, or can't be opened, named by SQLite's result code), `ERR_CONFIG` or `ERR_CLOSED`, each with
 * `sent: false` (a failed transaction is rolled back whole: the call counted nothing), and a count past
 * the safe-integer range with a `RangeError` (`ERR_COUNT_RANGE`). No message holds a key or the path.
 */
export declare function sqliteStore(options?: SqliteStoreOptions): SqliteStore;

export interface MysqlStoreOptions {
  /**
   * `mysql://user:password@host:port/database[?ssl-mode=…]` (`mariadb://` too). Default: the `DATABASE_URL`
   * environment variable, then `MYSQL_URL`, read on the first call, never at import or construction. The
   * URL's TLS parameters read: `ssl-mode` (or `sslmode`), mysql2's and PlanetScale's `ssl` (`true`,
   * `false`, `{"rejectUnauthorized":true}`), Prisma's `sslaccept`; ignored: `connection_limit`,
   * `pool_timeout`, `connect_timeout`, `socket_timeout`, `charset`, `timezone`, `sslcert`, `ssl_cert`; any
   * other parameter is refused with `ERR_CONFIG` naming it.
   */
  url?: string;
  /**
   * TLS, overriding the URL's. `'DISABLED'`: never; `'PREFERRED'` (the default, as the mysql client's): TLS
   * when the server offers it; `'REQUIRED'`: always; with neither is the certificate checked unless
   * `tls.ca` is given (then its chain, not the host name). `'VERIFY_CA'`: the chain, against `tls.ca` or
   * the public roots; `'VERIFY_IDENTITY'`: the chain and the host name. TLS is rustls (ring).
   */
  sslMode?: 'DISABLED' | 'PREFERRED' | 'REQUIRED' | 'VERIFY_CA' | 'VERIFY_IDENTITY';
  /** `ca`: PEM certificates to trust instead of the public roots (a private CA). */
  tls?: { ca?: string };
  /**
   * The fixed window's table. Default `'askdare_counters'`. The sliding window's and the token bucket's
   * states are kept in `TABLE_sw` and `TABLE_tb`; the algorithms run as the procedures `TABLE_fw_v1`,
   * `TABLE_sw_v1` and `TABLE_tb_v1` (at most 58 characters, so that every name fits MySQL's 64).
   */
  table?: string;
  /**
   * Bound on one call in milliseconds, connecting included; past it the call rejects with `ERR_TIMEOUT`,
   * whose `sent` says whether the call had been sent. A call waits on a row another session holds for at
   * most half of it in whole seconds, at least 1 (`innodb_lock_wait_timeout`). Default 2,000.
   */
  timeoutMs?: number;
  /**
   * Create the tables and procedures (`CREATE … IF NOT EXISTS`, under GET_LOCK) on the store's first
   * connection. Default true; false: run docs/mysql.sql.
   */
  createTable?: boolean;
  /**
   * How often, in ms, the store deletes the rows that count nothing, 500 per statement, on an idle
   * connection. Default 60,000; 0: never.
   */
  sweepIntervalMs?: number;
  /** Connections (batches on their way at once). Default 4, at most 64. */
  connections?: number;
  /** Called with the error of each failed call (the one its promise rejects with). */
  onError?: (error: RatestoreError) => void;
}

export interface MysqlStoreStats {
  readonly kind: 'mysql';
  readonly calls: number;
  readonly errors: Readonly<Record<string, number>>;
  readonly inFlight: number;
  /** Rows the store's sweeper deleted (see `sweepIntervalMs`). */
  readonly swept: number;
}

/** The store `mysqlStore()` returns. */
export interface MysqlStore extends RatestoreStore {
  readonly shared: true;
  /** One round trip (connecting, and creating the tables, first if need be). */
  ping(): Promise<void>;
  /** Opens a connection before the first hit. */
  connect(): Promise<void>;
  stats(): MysqlStoreStats;
  close(): Promise<void>;
}

/**
 * Counters in MySQL 8.0.29+ or MariaDB 10.6+, on the database's clock: each call one procedure call, its
 * own short transaction on its own key's row, sent in batches (one query per batch) on up to `connections`
 * connections, answering as the other stores do. Rejects with `ERR_CONFIG`, `ERR_CONNECTION`,
 * `ERR_TIMEOUT`, `ERR_AUTH`, `ERR_MYSQL` (another server error, with its number and SQLSTATE) or
 * `ERR_CLOSED`, and a count past the safe-integer range with a `RangeError` (`ERR_COUNT_RANGE`).
 * `ERR_TIMEOUT` and `ERR_CONNECTION` carry `sent`. A row held by another session past the lock wait is
 * `ERR_TIMEOUT` with `sent` true: rolled back, it counted nothing. No message holds a key, the URL or its
 * password.
 */
export declare function mysqlStore(options?: MysqlStoreOptions): MysqlStore;

/** The error a redisStore hit rejects with when the store cannot do it. */
export interface RedisStoreError extends RatestoreError {
  /**
   * On `ERR_TIMEOUT` and `ERR_CONNECTION` only: whether the hit had left the process. `false`: it was never
   * sent (no connection, or the store is backing off after failed connects), so it did not count. `true`:
   * it was sent and then timed out or lost its connection, so it may or may not have counted.
   */
  readonly sent?: boolean;
}

/**
 * What `createLimiter`, `check` and `clientIp` throw (or reject with) for a bad argument: a `TypeError`
 * with `code: 'ERR_INVALID_ARG_TYPE'` (a wrong type, an unknown option) or a `RangeError` with
 * `code: 'ERR_OUT_OF_RANGE'` (a number or name out of range). The message names the option, never a key.
 */
export interface RatestoreArgumentError extends RatestoreError {
  readonly name: 'TypeError' | 'RangeError';
  readonly code: 'ERR_INVALID_ARG_TYPE' | 'ERR_OUT_OF_RANGE';
}

/** The algorithms a limit can use. Sliding windows and token buckets need ratestore's own stores. */
export type LimitAlgorithm = 'fixed-window' | 'sliding-window' | 'token-bucket' | 'concurrency';

/**
 * A window limit: at most `limit` cost units per `windowMs`. A fixed window starts with the first
 * request and ends `windowMs` later; a sliding window weighs the previous aligned window by its share
 * still inside (see docs/algorithms.md).
 */
export interface WindowLimit {
  /** Default `'fixed-window'`. */
  algorithm?: 'fixed-window' | 'sliding-window';
  /**
   * Cost units allowed per window: a safe integer, 0 or more; or a function asked on every check for
   * this request's (plans and overrides that are not fixed tiers). A check whose function answers
   * something else rejects with a `TypeError` or `RangeError`, counting nothing, failOpen or not.
   */
  limit: number | PerRequest;
  /**
   * Window length in milliseconds: a positive safe integer up to 4,503,599,627,370 (2^52 µs, about 142
   * years), on every store; a longer one throws a `RangeError` at creation.
   */
  windowMs: number | PerRequest;
  /**
   * The policy's name in draft-8 headers, and the suffix of its counter's key when a request is checked
   * against several limits. 1 to 64 printable ASCII characters without `"` or `\`; default as
   * express-rate-limit names its policy: `60-in-1min`.
   */
  name?: string;
}

/**
 * A window's `limit` or `windowMs` computed per request, from the key and what the check was given
 * (`check(key, { context })`). It must answer at once (no promise). A limit given so is never held by
 * the block cache (another request's limit may differ), and is named `'per-request'` unless named.
 */
export type PerRequest = (key: string, info: PerRequestInfo) => number;

export interface PerRequestInfo {
  readonly cost: number;
  readonly tier: string | undefined;
  /** The check's `context`, as given. */
  readonly context: unknown;
}

/** A token bucket: `capacity` tokens, `refill` of them back every `intervalMs`. Needs ratestore's stores. */
export interface TokenBucketLimit {
  algorithm: 'token-bucket';
  /** Most tokens the bucket holds (the headers' limit): a positive safe integer. A new key starts full. */
  capacity: number;
  /** Tokens that come back every `intervalMs`: a positive safe integer. */
  refill: number;
  /** Milliseconds between refills: a positive safe integer. */
  intervalMs: number;
  /** As {@link WindowLimit.name}; default `100-per-10-in-1sec`. */
  name?: string;
}

/**
 * At most `limit` requests of a key in flight: a check takes a lease, and the answer's `release()`
 * (at the request's end) gives it back; a lease never given back (a crashed process) ends `leaseMs`
 * after it was taken. Each lease is a fixed window of 1 under `key + ':lease:' + i`. Needs one of
 * ratestore's stores. A check takes one lease whatever its cost; at most one per request.
 */
export interface ConcurrencyLimit {
  algorithm: 'concurrency';
  /** Most leases held at once: 1 to 256. */
  limit: number;
  /** Milliseconds after which a lease not given back ends by itself: a positive safe integer. */
  leaseMs: number;
  /** As {@link WindowLimit.name}; default `10-concurrent`. */
  name?: string;
}

/** One limit a request is checked against. */
export type Limit = WindowLimit | TokenBucketLimit | ConcurrencyLimit;

/**
 * The response headers a limiter writes:
 * - `'draft-6'` (default): `RateLimit-Policy`, `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`;
 * - `'draft-7'`: `RateLimit-Policy` and `RateLimit: limit=…, remaining=…, reset=…`;
 * - `'draft-8'`: the structured fields `RateLimit: "name"; r=…; t=…` and
 *   `RateLimit-Policy: "name"; q=…; w=…`, one list member per limit;
 * - `'legacy'`: `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (epoch seconds);
 * - `false`: none.
 *
 * Every refusal carries `Retry-After` (whole seconds, at least 1), whatever the style.
 */
export type HeaderStyle = 'draft-6' | 'draft-7' | 'draft-8' | 'legacy' | false;

interface LimiterCommonOptions {
  /** Where the counters are kept: ratestore's stores, or any other `RateLimitStore` (fixed windows only). */
  store: RateLimitStore;
  /** Default `'draft-6'`. */
  headers?: HeaderStyle;
  /**
   * Let requests through when the store fails (the answer then carries `error`); covers every store call,
   * the give-back of a refused request's cost included. Default false: a store error rejects `check`, so a
   * broken store never switches the limit off unnoticed.
   */
  failOpen?: boolean;
  /**
   * Keep a check's counters under the key as a Redis hash tag, `{key}` (`{key}:burst`, `{key}:daily`),
   * so that in a Redis Cluster every limit's key of a check lies in one slot and the check's limits are
   * one atomic step there as on the other stores. Default false: counters under `key` (a Cluster then
   * takes several limits one by one, given back when one refuses, unless the key holds a tag of its own).
   * Turning it on changes where counters live: counters kept under the plain key are not read, so each
   * key starts afresh once.
   */
  hashTag?: boolean;
  /**
   * Refusals kept in this process: once a limit refuses a key, checks of that key that the refusal
   * proves refused (see {@link BlockCacheOptions}) are refused with no store call until the time it
   * named, answering `cached: true`. Default: on (`maxKeys` 10,000) when `store.shared` is true, off
   * otherwise. `true` turns it on with the default bound, `false` off.
   */
  blockCache?: boolean | BlockCacheOptions;
  /**
   * A store to count in while the main store fails (typically a `memoryStore()`): see
   * {@link FallbackOptions}.
   */
  fallback?: RateLimitStore | FallbackOptions;
  /**
   * Called with each failure of the main store that a check or a probe met. `fallback` is true when
   * the fallback counted that check instead (and, for a failed probe, while the fallback counts).
   * A listener that throws is reported as an uncaught exception.
   */
  onError?: (error: unknown, info: { readonly fallback: boolean }) => void;
}

/**
 * The block cache's options. A refusal proves, until the time it named:
 * - a fixed window that answered `remaining` r: every cost above r is refused until the window ends;
 * - a sliding window or a token bucket that refused cost c: every cost of c or more is refused until
 *   the retry time it answered.
 *
 * Times are counted from when the check was sent, less 1 ms, so a cached refusal never outlasts the
 * store's. Refunds, decrements and resets made through the same store object in this process clear
 * what they may change; those made by another process (or another store object) are not seen until
 * the cached refusal ends.
 */
export interface BlockCacheOptions {
  /** Most refusals held (one per limit and key); the oldest goes first. A positive safe integer; default 10,000. */
  maxKeys?: number;
  /**
   * Most bytes the refusals are counted as (2 per character of an entry's id, plus 256); the oldest goes
   * first. A key longer than 256 characters is held as its SHA-256, so an entry is under 1 KB whatever
   * the key. A safe integer of 4,096 or more; default 16 MiB.
   */
  maxBytes?: number;
}

/**
 * The fallback store's options. While the main store fails, checks count in `store`; a failure opens a
 * circuit: checks then go straight to the fallback, and one probe at a time (`ping()` where the store
 * has one, else a `hit` of 0) asks the main store, every `probeMs`; the first one it answers closes it.
 * A check whose call had reached the main store when it failed (a timeout or a lost connection:
 * `sent: true`) may have counted there, so it is not counted again: it rejects (or, with `failOpen`,
 * passes) as without a fallback.
 */
export interface FallbackOptions {
  store: RateLimitStore;
  /**
   * The share of each limit the fallback allows (its `limit`, a bucket's `capacity` and `refill`),
   * rounded down, at least 1 (a limit of 0 stays 0): `1 / instances` keeps the sum over the app's instances at
   * the limit. Above 0, at most 1; default 1.
   */
  scale?: number;
  /** Milliseconds between probes of the main store while the fallback counts: a positive safe integer; default 250. */
  probeMs?: number;
}

/** One limit for every key, given at the top level: its counter is kept under the key `check` is given. */
export type SingleLimiterOptions = LimiterCommonOptions & Limit;

/** Several limits for every key (a burst limit and a daily quota): a request passes only if all allow. */
export interface MultiLimiterOptions extends LimiterCommonOptions {
  /** Each limit's counter is kept under `key + ':' + name` when there are several. */
  limits: Limit | readonly Limit[];
}

/** Limits by tier (anon, free, pro, admin, …): `check` names the key's tier. */
export interface TieredLimiterOptions<Tier extends string> extends LimiterCommonOptions {
  /**
   * Each tier's limit, or limits. A tier with one limit counts under the key itself, so tiers with one
   * limit each share a key's counter (an upgrade keeps what the key spent); put the tier in the key to
   * keep them apart.
   */
  tiers: Record<Tier, Limit | readonly Limit[]>;
}

export type LimiterOptions = SingleLimiterOptions | MultiLimiterOptions;

/** One limit's part of an answer. */
export interface LimitState {
  /** The limit's policy name. */
  readonly name: string;
  readonly algorithm: LimitAlgorithm;
  /** Whether this limit allowed the request. A limit whose store failed under `failOpen` allows. */
  readonly allowed: boolean;
  /** The limit (a bucket's capacity). */
  readonly limit: number;
  /** What is left after this request (a refused request took nothing). */
  readonly remaining: number;
  /** Milliseconds until the window ends (a bucket: until it is full again, 0 when it is). */
  readonly resetMs: number;
  /** When that is, in epoch milliseconds. */
  readonly resetAt: number;
  /** 0 when allowed; else whole seconds until the same request could pass with no other traffic, at least 1. */
  readonly retryAfter: number;
  /** The policy's window in milliseconds (a bucket: the time to fill from empty). */
  readonly windowMs: number;
}

/**
 * The answer of `check`: YATTA's `consume()` shape (`allowed`, `limit`, `remaining`, `retryAfter`,
 * `resetAt`), describing the limit that refused (the one that lasts longest) or, when allowed, the one
 * closest to refusing; every limit's own part is in `limits`.
 */
export interface LimitResult<Tier extends string = string> {
  /** Whether this request may proceed. A refused request costs nothing: every limit is as it was. */
  readonly allowed: boolean;
  readonly limit: number;
  readonly remaining: number;
  /** Whole seconds to wait before retrying: at least 1 when refused, 0 when allowed. */
  readonly retryAfter: number;
  /** When the reported limit's window ends, in epoch milliseconds. */
  readonly resetAt: number;
  /** Milliseconds until then. */
  readonly resetMs: number;
  /** The headers of the chosen style, and `Retry-After` when refused: pass them to the response. */
  readonly headers: Readonly<Record<string, string>>;
  /** Every limit checked, in the order given. */
  readonly limits: readonly LimitState[];
  /** The tier checked, on a tiered limiter. */
  readonly tier?: Tier;
  /**
   * The store's first error, when `failOpen` let the check answer despite it; on an answer of the
   * fallback, the main store's failure that sent it there.
   */
  readonly error?: unknown;
  /** Present (true) when the block cache refused this check, with no store call. */
  readonly cached?: true;
  /** Present (true) when the fallback store counted this check, the main store failing. */
  readonly fallback?: true;
  /**
   * On a limiter with a concurrency limit: gives the request's lease back (call it when the request
   * ends). A second call, or one on an answer that holds no lease (a refusal, a limiter without a
   * concurrency limit), does nothing, so a handler can always call it.
   */
  readonly release: () => Promise<void>;
}

/** A limiter's figures since its creation. */
export interface LimiterStats {
  /** Checks answered (allowed or refused; not those that rejected). */
  readonly checks: number;
  /** Checks the block cache refused, with no store call. */
  readonly cacheRefusals: number;
  /** Refusals the block cache holds now (ended ones included until looked up or dropped). */
  readonly cacheEntries: number;
  /** The bytes the held refusals are counted as (see {@link BlockCacheOptions.maxBytes}). */
  readonly cacheBytes: number;
  /** Refusals dropped to stay within `maxKeys` or `maxBytes`. */
  readonly cacheEvictions: number;
  /** Checks the fallback store counted. */
  readonly fallbackChecks: number;
  /** Whether the circuit is open: checks go to the fallback, the main store having failed. */
  readonly fallbackActive: boolean;
}

export interface CheckOptions {
  /** What this request costs: a positive safe integer. Default 1. */
  cost?: number;
  /** Anything the limits' per-request functions need (a user's plan): passed to them as `info.context`. */
  context?: unknown;
}

export interface TieredCheckOptions<Tier extends string> extends CheckOptions {
  /** The key's tier: one of the limiter's. */
  tier: Tier;
}

export interface Limiter {
  /**
   * Counts `cost` (default 1) against `key` under every limit and says whether the request may proceed.
   * Rejects with a {@link RatestoreArgumentError} for a bad key or cost, and with the store's error when
   * it fails (unless `failOpen`).
   */
  check(key: string, cost?: number | CheckOptions): Promise<LimitResult<never>>;
  /**
   * Resets `key` under every limit and tier: its counters in the store (and the fallback) and what the
   * block cache holds for it. Rejects with the store's error, a `TypeError` for a key that is not a
   * string, or `ERR_UNSUPPORTED` (resetting nothing) when the store has no `reset(key)` (a
   * `RateLimitStore` with only `hit`).
   */
  reset(key: string): Promise<void>;
  /**
   * Resolves with the answer of a check of `key` (counted, as `check` counts) once one is allowed, or
   * rejects with `ERR_TIMEOUT` (nothing counted) when none is within `timeoutMs`. It does not poll: after
   * a refusal it sleeps until the time the refusal named, or until a request of this limiter on the
   * same key gives its lease back (`release()`), and checks once more.
   */
  wait(key: string, options: WaitOptions): Promise<LimitResult<never>>;
  stats(): LimiterStats;
}

export interface WaitOptions extends CheckOptions {
  /** The longest wait in milliseconds: a safe integer, 0 or more. */
  timeoutMs: number;
}

export interface TieredWaitOptions<Tier extends string> extends WaitOptions {
  /** The key's tier: one of the limiter's. */
  tier: Tier;
}

export interface TieredLimiter<Tier extends string> {
  /** As {@link Limiter.check}, under the limits of `options.tier`. */
  check(key: string, options: TieredCheckOptions<Tier>): Promise<LimitResult<Tier>>;
  /** As {@link Limiter.reset}. */
  reset(key: string): Promise<void>;
  /** As {@link Limiter.wait}, under the limits of `options.tier`. */
  wait(key: string, options: TieredWaitOptions<Tier>): Promise<LimitResult<Tier>>;
  stats(): LimiterStats;
  /** The tier names, in the order given. */
  readonly tiers: readonly Tier[];
}

/**
 * A limiter for route handlers and Next.js's proxy, over any store. On ratestore's stores each limit is
 * one atomic, limit-aware call (a refused request costs one call and changes nothing), and what a
 * request took is given back only to the window it took it from; on another `RateLimitStore`, a fixed
 * window is a `hit`, never given back (a refused hit stays counted), so no window allows more than `limit`.
 * Bad options throw a {@link RatestoreArgumentError} here.
 */
export declare function createLimiter<const Tier extends string>(
  options: TieredLimiterOptions<Tier>,
): TieredLimiter<Tier>;
export declare function createLimiter(options: LimiterOptions): Limiter;

/** A Fetch `Headers` object, or anything with its `get`. */
export interface HeadersLike {
  get(name: string): string | null;
}

/** A Fetch `Request` (Next.js's `NextRequest` too), or Node's `http.IncomingMessage`. */
export type RequestLike =
  | { readonly headers: HeadersLike }
  | {
      readonly headers: Readonly<Record<string, string | readonly string[] | undefined>>;
      readonly socket?: { readonly remoteAddress?: string | undefined } | null;
    };

/** The platforms whose own header of the client's address `clientIp` can read, when the app names one. */
export type ClientIpPlatform = 'vercel' | 'cloudflare' | 'fly' | 'fastly' | 'akamai';

/** The headers `clientIp` can read the client's address from. */
export type ClientIpHeader =
  | 'x-forwarded-for'
  | 'forwarded'
  | 'x-vercel-forwarded-for'
  | 'cf-connecting-ip'
  | 'fly-client-ip'
  | 'fastly-client-ip'
  | 'true-client-ip'
  | 'x-real-ip';

export interface ClientIpOptions {
  /**
   * How many proxies in front of the app append to `x-forwarded-for` (or `Forwarded`) (a load
   * balancer, Vercel's edge: 1). The client's address is the entry the outermost of them wrote; entries
   * further left came from the client and are never used. Default 0: no proxy, so only the socket's peer
   * counts (a Fetch `Request` has none, and answers `undefined`). Not with `trustedProxyRanges`.
   */
  trustedProxies?: number;
  /**
   * Instead of a count: the trusted proxies' addresses, as CIDRs (`'10.0.0.0/8'`, `'fd00::/8'`) or
   * addresses. Hops are read nearest first (the socket's peer, then the header's entries right to
   * left), past every one in a range; the first outside them is the client. With a platform's header,
   * the header is believed only from a peer in a range.
   */
  trustedProxyRanges?: readonly string[];
  /** Read the header this platform overwrites with the address it saw. None is trusted unless named. */
  platform?: ClientIpPlatform;
  /**
   * The header to read (case-insensitive): `'x-forwarded-for'` (the default) or RFC 7239's
   * `'forwarded'`, which proxies append to, or one a platform or the proxy in front overwrites with one
   * address. Not with `platform`.
   */
  header?: ClientIpHeader;
  /**
   * An IPv6 client's key is its subnet of this prefix (1 to 128), in express-rate-limit 8's form
   * (`2001:db8:abcd:1200::/56`), since one IPv6 client holds at least a /64; `false` for the whole
   * address. Default 56. IPv4 addresses are never grouped.
   */
  ipv6Subnet?: number | false;
}

/**
 * The client's IP address as a key: the socket's peer, the entry of `x-forwarded-for` (or `Forwarded`)
 * that the trusted proxies wrote, counted from the right, or the named platform's header, so that a
 * client cannot choose its own key by sending a header. An IPv6 address answers its /56 (see
 * {@link ClientIpOptions.ipv6Subnet}); an IPv4-mapped or dotted IPv4-compatible IPv6 address, and one of
 * NAT64's well-known prefix, 6to4 or Teredo, answers the IPv4 address it holds; ports and brackets are
 * stripped. `undefined` when there is no address to trust
 * (or the entry is not an IP address).
 */
export declare function clientIp(request: RequestLike | HeadersLike, options?: ClientIpOptions): string | undefined;

// Adapters for other rate limiters: universal-rate-limit's Store and express-rate-limit's.

/** The algorithm an adapter counts with, on its ratestore store. */
export type AdapterAlgorithm = 'fixed-window' | 'sliding-window';

/** What universal-rate-limit's `increment` answers. */
export interface IncrementResult {
  /** Hits counted against the key, this one included (for a sliding window: the weighted estimate). */
  totalHits: number;
  /** When the current window ends. */
  resetTime: Date;
}

/** universal-rate-limit's `Store`, over a ratestore store. */
export interface UniversalStore {
  /** Counts a hit against `key`, whatever the limit (the limiter compares `totalHits` with it). */
  increment(key: string): Promise<IncrementResult>;
  /**
   * Takes back one hit this adapter counted, from the window it was counted in only (a decrement after
   * the window's edge takes nothing from the next one); never below 0, and never opens a window. The
   * windows of the last 10,000 keys incremented are remembered; an older key is given nothing back.
   */
  decrement(key: string): Promise<void>;
  /** Forgets the key, under every algorithm. */
  resetKey(key: string): Promise<void>;
  /** Empties the whole ratestore store (a redisStore: every key under its prefix). */
  resetAll(): Promise<void>;
  /**
   * Does nothing, and the store stays usable: ratestore's stores sweep ended windows without a timer
   * that could keep the process alive, and the ratestore store belongs to the caller (close a redisStore
   * with its own `close()`).
   */
  shutdown(): void;
}

export interface UniversalStoreOptions {
  /** Window length in milliseconds: a positive safe integer. Required. */
  windowMs: number;
  /**
   * `'fixed-window'` (default): `hit`'s counter, a window that starts at the key's first hit.
   * `'sliding-window'`: the store's `slidingWindow`, aligned windows with the previous one weighted by its
   * share still inside.
   */
  algorithm?: AdapterAlgorithm;
  /** Where the counters are kept. Default: a new `memoryStore()`. */
  store?: RatestoreStore;
}

/**
 * A ratestore store as universal-rate-limit's `Store`: `rateLimit({ store: universalStore({ windowMs }) })`.
 * Every call is one atomic operation of the store. Options of the wrong type throw a `TypeError`, values out
 * of range a `RangeError`; a call with a key that is not a string rejects with a `TypeError`.
 */
export declare function universalStore(options: UniversalStoreOptions): UniversalStore;

/** What express-rate-limit's store methods answer for a key. */
export interface ClientRateLimitInfo {
  /** Hits counted against the key (for a sliding window: the weighted estimate). */
  totalHits: number;
  /** When the current window ends. */
  resetTime: Date;
}

/** express-rate-limit's (v7 and v8) `Store`, over a ratestore store. */
export interface ExpressStore {
  /** Called by `rateLimit()`: takes its `windowMs`. Calls before it reject with `ERR_NOT_INITIALIZED`. */
  init(options: { readonly windowMs: number }): void;
  /** The key's count and window end; `undefined` when nothing counts against it. */
  get(key: string): Promise<ClientRateLimitInfo | undefined>;
  /** Counts a hit against `key`, whatever the limit. */
  increment(key: string): Promise<ClientRateLimitInfo>;
  /**
   * Takes back one hit (`skipFailedRequests`, `skipSuccessfulRequests`), from the window it was counted
   * in only; never below 0, never opens a window. The windows of the last 10,000 keys incremented are
   * remembered; an older key is given nothing back.
   */
  decrement(key: string): Promise<void>;
  /** Forgets the key, under every algorithm. */
  resetKey(key: string): Promise<void>;
  /** Empties the whole ratestore store, other limiters' keys included when they share it. */
  resetAll(): Promise<void>;
  /**
   * Lets another `expressStore` over the same ratestore store take this one's prefix. Stops no timer (there is
   * none), resets nothing and leaves the ratestore store open.
   */
  shutdown(): void;
  /** True over a memoryStore, false over a redisStore: whether other processes see these counters. */
  readonly localKeys: boolean;
  /** The `prefix` option: prepended to every key. */
  readonly prefix: string;
}

export interface ExpressStoreOptions {
  /** Where the counters are kept. Default: a new `memoryStore()`. */
  store?: RatestoreStore;
  /** As for {@link UniversalStoreOptions.algorithm}. Default `'fixed-window'`. */
  algorithm?: AdapterAlgorithm;
  /**
   * Prepended to every key (default `''`), so that several limiters can count on one ratestore store. Two
   * `expressStore`s over one store with the same prefix would count each request twice: the second one's
   * `init()` throws, and express-rate-limit logs it.
   */
  prefix?: string;
}

/**
 * A ratestore store as express-rate-limit's `Store`: `rateLimit({ store: expressStore(), limit, windowMs })`.
 * The window length comes from `rateLimit()`'s options, through `init()`. Options of the wrong type throw a
 * `TypeError`, values out of range a `RangeError`; a call with a key that is not a string rejects with a
 * `TypeError`.
 */
export declare function expressStore(options?: ExpressStoreOptions): ExpressStore;
