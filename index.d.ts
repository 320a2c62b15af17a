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
  | 'ERR_CLOSED'
  | 'ERR_INTERNAL'
  | 'ERR_UNSUPPORTED';

/**
 * An error made by ratestore (an `Error`, `TypeError` or `RangeError`): its message starts with
 * `ratestore: ` and holds no key, URL password or token.
 */
export interface RatestoreError extends Error {
  readonly code: RatestoreErrorCode;
  /** On `ERR_TIMEOUT` and `ERR_CONNECTION` only: whether the call had left the process (see {@link RedisStoreError}). */
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
  readonly connects: number;
  /** Connections opened after one was lost. */
  readonly reconnects: number;
  readonly connectFailures: number;
  readonly connectionLosses: number;
  /** Calls that timed out, sent or not. */
  readonly timeouts: number;
  /** Scripts sent again whole (EVAL) after NOSCRIPT. */
  readonly noscriptReloads: number;
  /** MOVED and ASK redirections followed (Redis Cluster). */
  readonly redirections: number;
  readonly latencyMs: LatencyStats;
}

/**
 * The Prometheus text exposition (format 0.0.4) of the stores' `stats()`, each labelled `store="<name>"`:
 * `ratestore_calls_total`, `ratestore_errors_total{code}`, `ratestore_call_latency_seconds` (a summary), ….
 */
export declare function metricsText(
  stores: Readonly<Record<string, { stats(): MemoryStoreStats | RedisStoreStats }>>,
): string;

/** Options of a limit-aware consume. */
export interface ConsumeOptions {
  /** Most cost units allowed per window: a safe integer, 0 or more. */
  limit: number;
  /** Window length in milliseconds: a positive safe integer. */
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

/** A sliding window over one store (seed 004's): the previous window weighted by its share still inside. */
export interface SlidingWindow {
  /** Adds `amount` (default 1; 0 reads) with no limit; `count` is the estimate including it. */
  increment(key: string, windowMs: number, amount?: number): Promise<CounterHit>;
  /** Takes back up to `amount` (default 1), current window first; never below 0, never creates a state. */
  decrement(key: string, windowMs: number, amount?: number): Promise<CounterHit>;
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
   * resolves `null`, changing nothing, when no window is open: a refund never opens a window.
   */
  refund(key: string, amount: number): Promise<CounterHit | null>;
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
   * `redis://[[user]:password@]host[:port][/db]`, `rediss://…` (TLS) or `redis+unix:///path/to/socket[?db=N]`.
   * Default: the `REDIS_URL` environment variable, then `KV_URL`, read on the first hit. An `https://`
   * URL (such as Upstash's REST endpoint) is refused: use the database's `rediss://` endpoint. With
   * `cluster`, one or more comma-separated seed node URLs (`redis://h1:7000,redis://h2:7001`).
   */
  url?: string;
  /**
   * The password (Upstash and Vercel call it a token). Default: the `REDIS_TOKEN` environment variable,
   * else the password in the URL. Wins over a password in the URL.
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
  /** TLS settings for `rediss://`. */
  tls?: {
    /** PEM certificate(s) to trust instead of the public roots: for a server with a private CA. */
    ca?: string;
  };
  /**
   * Called with the error of each failed call (the one its promise rejects with), and on the
   * connection's changes of state (one server; a cluster reports no connection events).
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
  /** This store's calls and failures, and its connection's figures (shared by stores on one connection). */
  stats(): RedisStoreStats;
  /**
   * Refuses later hits (they reject with `ERR_CLOSED`) and ends the connection. Resolves once the hits in
   * flight have settled. An idle store never keeps the process alive, closed or not.
   */
  close(): Promise<void>;
}

/**
 * Counters in Redis, shared by every instance of an app: one Lua script per hit, on one multiplexed
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

/** The error a redisStore hit rejects with when the store cannot do it. */
export interface RedisStoreError extends RatestoreError {
  /**
   * On `ERR_TIMEOUT` and `ERR_CONNECTION` only: whether the hit had left the process. `false`: it was never
   * sent (no connection, or the store is backing off after failed connects), so it did not count. `true`:
   * it was sent and then timed out or lost its connection, so it may or may not have counted.
   */
  readonly sent?: boolean;
}

export interface LimiterOptions {
  /** Where the counters are kept. */
  store: RateLimitStore;
  /** Requests (or cost units) allowed per window. */
  limit: number;
  /** Window length in milliseconds. */
  windowMs: number;
  /**
   * Allow requests when the store fails (the answer then carries `error`). Default false: a store
   * error rejects `check`, so a broken store never switches the limit off unnoticed.
   */
  failOpen?: boolean;
}

export interface LimitResult {
  /** Whether this request may proceed. A refused request was refunded: it costs nothing. */
  readonly allowed: boolean;
  readonly limit: number;
  /** What is left in this window after this request (0 when refused). */
  readonly remaining: number;
  /** Milliseconds until the window ends. */
  readonly resetMs: number;
  /** Whole seconds to wait before retrying: at least 1 when refused, 0 when allowed. */
  readonly retryAfter: number;
  /** `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`, and `Retry-After` when refused. */
  readonly headers: Readonly<Record<string, string>>;
  /** The store's error, only when `failOpen` let the request through. */
  readonly error?: unknown;
}

export interface Limiter {
  /** Counts `cost` (default 1) against `key` and says whether the request may proceed. */
  check(key: string, cost?: number): Promise<LimitResult>;
  readonly limit: number;
  readonly windowMs: number;
}

/** A fixed-window limiter over any store, for route handlers without a framework limiter. */
export declare function createLimiter(options: LimiterOptions): Limiter;
