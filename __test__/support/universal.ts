// universal-rate-limit's Store interface and a small rateLimit() driver, written from its documentation
// (the package is not on the registry the tests can reach): the adapter runs through this as it would
// through the limiter itself. A hit always counts; a request is limited once totalHits passes the limit;
// a store error is re-thrown unless passOnStoreError lets the request through.

export interface IncrementResult {
  totalHits: number;
  resetTime: Date;
}

export interface Store {
  increment(key: string): Promise<IncrementResult>;
  decrement(key: string): Promise<void>;
  resetKey(key: string): Promise<void>;
  resetAll(): Promise<void>;
}

export interface RateLimitOptions {
  windowMs: number;
  limit: number;
  store: Store;
  /** The client a request counts against. Default: the first address of X-Forwarded-For. */
  keyGenerator?: (request: Request) => string | Promise<string>;
  passOnStoreError?: boolean;
}

export interface RateLimitResult {
  limited: boolean;
  limit: number;
  remaining: number;
  /** Undefined when a store error let the request through. */
  resetTime: Date | undefined;
  totalHits: number;
}

const clientAddress = (request: Request): string =>
  request.headers.get('x-forwarded-for')?.split(',')[0].trim() || 'unknown';

export function rateLimit(options: RateLimitOptions): (request: Request) => Promise<RateLimitResult> {
  const { limit, store, keyGenerator = clientAddress, passOnStoreError = false } = options;
  return async (request) => {
    const key = await keyGenerator(request);
    let result: IncrementResult;
    try {
      result = await store.increment(key);
    } catch (error) {
      if (!passOnStoreError) throw error;
      return { limited: false, limit, remaining: limit, resetTime: undefined, totalHits: 0 };
    }
    const { totalHits, resetTime } = result;
    return { limited: totalHits > limit, limit, remaining: Math.max(0, limit - totalHits), resetTime, totalHits };
  };
}

/** A request from one client, as a route handler receives it. */
export const requestFrom = (client: string): Request =>
  new Request('http://127.0.0.1/api', { headers: { 'x-forwarded-for': client } });
