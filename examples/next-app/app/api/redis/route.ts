import { createLimiter, redisStore } from 'ratestore';
import { limited, limits } from '../../../lib/limit';

export const runtime = 'nodejs';

// redisStore() reads REDIS_URL (or KV_URL) and REDIS_TOKEN on its first hit, not here:
// `next build` imports this module with no credentials set.
const limiter = createLimiter({ store: redisStore(), ...limits() });

export function GET(request: Request): Promise<Response> {
  return limited(limiter, request, 'redis');
}
