import { createLimiter, memoryStore } from 'ratestore';
import { limited, limits } from '../../../lib/limit';

// A native addon runs on the Node.js runtime only, never on the Edge runtime.
export const runtime = 'nodejs';

// A named store keeps its counters across the dev server's module reloads.
const limiter = createLimiter({ store: memoryStore({ name: 'next-example' }), ...limits() });

export function GET(request: Request): Promise<Response> {
  return limited(limiter, request, 'memory');
}
