// Next.js 16 runs proxy.ts on the Node.js runtime, where ratestore's native addon loads: one place
// that limits every /api route.
import { NextResponse, type NextRequest } from 'next/server';
import { createLimiter } from 'ratestore';
import { clientKey, limit, store } from './lib/limit';

// Once per server process: the store keeps its counters (or its connection) across requests.
const limiter = createLimiter({ store: store('next-example-proxy'), ...limit() });

export async function proxy(request: NextRequest): Promise<NextResponse> {
  let answer;
  try {
    answer = await limiter.check(clientKey(request));
  } catch (error) {
    // A store that cannot count refuses the request: the limit never switches off unnoticed.
    console.error(error);
    return NextResponse.json({ error: 'rate limiter unavailable' }, { status: 503 });
  }
  if (!answer.allowed) {
    return NextResponse.json({ error: 'too many requests' }, { status: 429, headers: answer.headers });
  }
  return NextResponse.next({ headers: answer.headers });
}

export const config = { matcher: '/api/:path*' };
