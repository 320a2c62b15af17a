import { createLimiter } from 'ratestore';
import { clientKey, limit, store } from '../../lib/limit';

// A route handler that limits itself, outside the proxy's /api matcher.
export const runtime = 'nodejs';

const VERSION = 1;

const limiter = createLimiter({ store: store('next-example-route'), ...limit() });

export async function GET(request: Request): Promise<Response> {
  const answer = await limiter.check(clientKey(request));
  if (!answer.allowed) {
    return Response.json({ error: 'too many requests' }, { status: 429, headers: answer.headers });
  }
  return Response.json({ version: VERSION, remaining: answer.remaining }, { headers: answer.headers });
}
