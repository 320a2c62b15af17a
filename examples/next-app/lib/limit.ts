// What the proxy and the route handler share: the store, the limit (from the environment, so that a
// test can use short windows) and the client's key.
import { clientIp, memoryStore, redisStore, type RateLimitStore, type WindowLimit } from 'ratestore';

export function limit(): WindowLimit {
  return {
    limit: Number(process.env.RATE_LIMIT ?? 10),
    windowMs: Number(process.env.RATE_WINDOW_MS ?? 60_000),
  };
}

// redisStore() reads REDIS_URL (or KV_URL, or Upstash's REST variables) on its first hit, never here: `next build`
// loads this module with no credentials set. memoryStore({ name }) keeps its counters across the dev
// server's module reloads.
export function store(name: string): RateLimitStore {
  return process.env.RATE_STORE === 'redis' ? redisStore() : memoryStore({ name });
}

// One proxy in front (Vercel, or a load balancer) appends the client's address to x-forwarded-for;
// the entries left of it came from the client and are not believed.
export function clientKey(request: Request): string {
  return `ip:${clientIp(request, { trustedProxies: 1 }) ?? 'unknown'}`;
}
