// createLimiter's header styles beside express-rate-limit 8's own output: a real Express app on
// loopback answers one route through express-rate-limit and one through createLimiter, with the
// same limit and window, and the headers of each answer must match.
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, memoryStore, type HeaderStyle } from '../index.js';

interface Response {
  status(code: number): Response;
  set(headers: Record<string, string>): Response;
  send(body: string): void;
}
type Handler = (request: unknown, response: Response, next: () => void) => void;
interface App {
  get(path: string, ...handlers: Handler[]): void;
  listen(port: number, host: string, ready: () => void): Server;
}
// express and express-rate-limit, loaded as they are installed (express comes as express-rate-limit's peer).
const load = createRequire(__filename);
const express = load('express') as () => App;
const { rateLimit } = load('express-rate-limit') as { rateLimit: (options: object) => Handler };

const STYLES = ['draft-6', 'draft-7', 'draft-8', 'legacy'] as const;
const LIMIT = 2;
const WINDOW_MS = 60_000;
const ok: Handler = (_request, response) => response.send('ok');

let server: Server;
let base: string;

beforeAll(async () => {
  const app = express();
  for (const style of STYLES) {
    app.get(
      `/express/${style}`,
      rateLimit({
        windowMs: WINDOW_MS,
        limit: LIMIT,
        standardHeaders: style === 'legacy' ? false : style,
        legacyHeaders: style === 'legacy',
        keyGenerator: () => 'client',
        validate: false,
      }),
      ok,
    );
    const limiter = createLimiter({ store: memoryStore(), limit: LIMIT, windowMs: WINDOW_MS, headers: style });
    app.get(`/ratestore/${style}`, async (_request, response) => {
      const answer = await limiter.check('client');
      response
        .status(answer.allowed ? 200 : 429)
        .set({ ...answer.headers })
        .send(answer.allowed ? 'ok' : 'Too many requests, please try again later.');
    });
  }
  await new Promise<void>((resolve) => {
    server = app.listen(0, '127.0.0.1', resolve);
  });
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

/** The rate-limit headers of an answer, by lowercase name. */
async function limitHeaders(path: string): Promise<{ status: number; headers: Record<string, string> }> {
  const response = await fetch(base + path);
  await response.text();
  const headers: Record<string, string> = {};
  for (const [name, value] of response.headers) {
    if (/ratelimit|retry-after/.test(name)) headers[name] = value;
  }
  return { status: response.status, headers };
}

describe("headers match express-rate-limit 8's", () => {
  for (const style of STYLES) {
    it(style, async () => {
      for (let i = 0; i <= LIMIT; i++) {
        const theirs = await limitHeaders(`/express/${style}`);
        const ours = await limitHeaders(`/ratestore/${style}`);
        expect(ours.status).toBe(theirs.status);
        expect(Object.keys(ours.headers).sort()).toEqual(Object.keys(theirs.headers).sort());
        if (style === 'draft-8') {
          // express-rate-limit adds a partition key (a hash of the key); ratestore leaves it out.
          expect(theirs.headers['ratelimit-policy']).toMatch(/; pk=:[A-Za-z0-9+/=]+:$/);
          theirs.headers['ratelimit-policy'] = theirs.headers['ratelimit-policy'].replace(/; pk=:[^:]+:$/, '');
        }
        if (style === 'legacy') {
          // Epoch seconds: the two windows opened a few ms apart, maybe across a second.
          const reset = 'x-ratelimit-reset';
          expect(Math.abs(Number(ours.headers[reset]) - Number(theirs.headers[reset]))).toBeLessThanOrEqual(1);
          ours.headers[reset] = theirs.headers[reset];
        }
        expect(ours.headers).toEqual(theirs.headers);
        if (i === LIMIT) expect(Number(ours.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      }
    });
  }

  it('sends Retry-After on a refusal even with headers: false', async () => {
    const style: HeaderStyle = false;
    const limiter = createLimiter({ store: memoryStore(), limit: 0, windowMs: 1_000, headers: style });
    const allowed = await createLimiter({ store: memoryStore(), limit: 1, windowMs: 1_000, headers: false }).check('k');
    expect(allowed.headers).toEqual({});
    expect((await limiter.check('k')).headers).toEqual({ 'Retry-After': '1' });
  });
});
