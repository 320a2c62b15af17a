// One place for what both routes do: the limits (from the environment, so a test can use
// short windows), the client key, and the answer with the limiter's headers.
import type { Limiter, LimiterOptions } from 'ratestore';

export function limits(): Pick<LimiterOptions, 'limit' | 'windowMs'> {
  return {
    limit: Number(process.env.RATE_LIMIT ?? 10),
    windowMs: Number(process.env.RATE_WINDOW_MS ?? 60_000),
  };
}

// Behind Vercel or another proxy that sets it, x-forwarded-for is the client address.
function clientKey(request: Request): string {
  const forwarded = request.headers.get('x-forwarded-for');
  return `ip:${forwarded?.split(',')[0].trim() || 'unknown'}`;
}

export async function limited(limiter: Limiter, request: Request, store: string): Promise<Response> {
  let answer;
  try {
    answer = await limiter.check(clientKey(request));
  } catch (error) {
    // A store that cannot count refuses the request: the limit never switches off unnoticed.
    console.error(error);
    return Response.json({ error: 'rate limiter unavailable' }, { status: 503 });
  }
  if (!answer.allowed) {
    return Response.json({ error: 'too many requests' }, { status: 429, headers: answer.headers });
  }
  return Response.json({ store, remaining: answer.remaining }, { headers: answer.headers });
}
