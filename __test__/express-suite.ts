// expressStore in a real Express app with express-rate-limit 8, on loopback: every ratestore store
// runs these cases, with both algorithms. Every limiter logs through a recorder, and no case may
// leave a warning or an error in it.
import { randomUUID } from 'node:crypto';
import express from 'express';
import { ipKeyGenerator, rateLimit, type Options } from 'express-rate-limit';
import { afterEach, describe, expect, it } from 'vitest';
import { expressStore, type AdapterAlgorithm, type RatestoreStore } from '../index.js';
import { send, serve, type Served } from './support/http.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const ALGORITHMS: AdapterAlgorithm[] = ['fixed-window', 'sliding-window'];

/** A logger for express-rate-limit that keeps what it is told. */
export function recorder() {
  const logged: string[] = [];
  const keep =
    (level: string) =>
    (...args: unknown[]) =>
      logged.push(
        `${level}: ${args.map((a) => (a instanceof Error ? `${a.name} ${a.message}` : String(a))).join(' ')}`,
      );
  return { logged, logger: { warn: keep('warn'), error: keep('error') } };
}

/** Polls `read` until it answers `expected` (a decrement runs after the response has been sent). */
export async function eventually<T>(read: () => Promise<T>, expected: T, ms = 5_000): Promise<void> {
  const end = Date.now() + ms;
  let value = await read();
  while (value !== expected && Date.now() < end) {
    await sleep(10);
    value = await read();
  }
  expect(value).toBe(expected);
}

export function expressSuite(name: string, create: () => RatestoreStore): void {
  for (const algorithm of ALGORITHMS) {
    describe(`expressStore(${algorithm}) over ${name}, in express-rate-limit`, () => {
      const servers: Served[] = [];
      let logged: string[] = [];
      afterEach(async () => {
        await Promise.all(servers.splice(0).map((server) => server.close()));
        expect(logged).toEqual([]);
      });

      /** An app with the limiter before /ok and /fail, and /reset (not limited) calling its resetKey. */
      async function app(options: Partial<Options> = {}) {
        const log = recorder();
        logged = log.logged;
        const store = expressStore({ store: create(), algorithm });
        const limiter = rateLimit({ store, limit: 3, windowMs: 60_000, logger: log.logger, ...options });
        const app = express();
        app.post('/reset', async (request, response) => {
          await limiter.resetKey(ipKeyGenerator(request.ip!));
          response.send('reset');
        });
        app.use(limiter);
        app.get('/ok', (_request, response) => {
          response.send('ok');
        });
        app.get('/fail', (_request, response) => {
          response.status(500).send('fail');
        });
        const served = await serve(app);
        servers.push(served);
        const get = async (path: string, times = 1) => {
          const statuses = [];
          for (let i = 0; i < times; i++) statuses.push((await send(served.url + path)).status);
          return statuses;
        };
        return { url: served.url, limiter, store, get };
      }

      it('lets exactly `limit` requests pass, then answers 429', async () => {
        const { url, get } = await app();
        expect(await get('/ok', 5)).toEqual([200, 200, 200, 429, 429]);
        expect((await send(url + '/ok')).body).toBe('Too many requests, please try again later.');
      });

      for (const draft of ['draft-6', 'draft-7', 'draft-8'] as const) {
        it(`writes the ${draft} headers, and Retry-After once limited`, async () => {
          let { url } = await app({ standardHeaders: draft, legacyHeaders: false });
          let { headers } = await send(url + '/ok');
          // A sliding window's reset is its aligned edge. Within 3 s of it, the requests below could
          // straddle it, and one after it is weighed against the whole window before: wait past the
          // edge and begin again on a fresh store, so the answers checked here are one window's.
          const secondsToEdge = (h: typeof headers) =>
            Number(h['ratelimit-reset'] ?? /(?:reset|t)=(\d+)$/.exec(String(h['ratelimit']))?.[1]);
          const edge = secondsToEdge(headers);
          if (algorithm === 'sliding-window' && edge < 3) {
            await sleep(edge * 1000 + 200);
            ({ url } = await app({ standardHeaders: draft, legacyHeaders: false }));
            ({ headers } = await send(url + '/ok'));
          }
          let reset: number;
          if (draft === 'draft-6') {
            expect(headers['ratelimit-policy']).toBe('3;w=60');
            expect(headers['ratelimit-limit']).toBe('3');
            expect(headers['ratelimit-remaining']).toBe('2');
            reset = Number(headers['ratelimit-reset']);
          } else if (draft === 'draft-7') {
            expect(headers['ratelimit-policy']).toBe('3;w=60');
            const match = /^limit=3, remaining=2, reset=(\d+)$/.exec(String(headers['ratelimit']));
            expect(match).not.toBeNull();
            reset = Number(match![1]);
          } else {
            expect(headers['ratelimit-policy']).toMatch(/^"3-in-1min"; q=3; w=60; pk=:[A-Za-z0-9+/=]+:$/);
            const match = /^"3-in-1min"; r=2; t=(\d+)$/.exec(String(headers['ratelimit']));
            expect(match).not.toBeNull();
            reset = Number(match![1]);
          }
          // A fixed window opened by this request ends a full window from now; an aligned one within it.
          if (algorithm === 'fixed-window') expect(reset).toBe(60);
          expect(reset).toBeGreaterThanOrEqual(1);
          expect(reset).toBeLessThanOrEqual(60);
          expect(headers['x-ratelimit-limit']).toBeUndefined();
          for (let i = 0; i < 2; i++) await send(url + '/ok');
          const limited = await send(url + '/ok');
          expect(limited.status).toBe(429);
          const retryAfter = Number(limited.headers['retry-after']);
          expect(retryAfter).toBeGreaterThanOrEqual(reset - 1);
          expect(retryAfter).toBeLessThanOrEqual(reset);
        });
      }

      it('writes the legacy X-RateLimit headers by default', async () => {
        const { url } = await app();
        const { headers } = await send(url + '/ok');
        expect(headers['x-ratelimit-limit']).toBe('3');
        expect(headers['x-ratelimit-remaining']).toBe('2');
        const reset = Number(headers['x-ratelimit-reset']) * 1000;
        expect(reset).toBeGreaterThan(Date.now());
        expect(reset).toBeLessThanOrEqual(Date.now() + 61_000);
      });

      it('takes failed requests back with skipFailedRequests', async () => {
        const { limiter, get } = await app({ skipFailedRequests: true });
        const count = async () => (await limiter.getKey('127.0.0.1'))?.totalHits ?? 0;
        for (let i = 0; i < 5; i++) {
          expect(await get('/fail')).toEqual([500]);
          await eventually(count, 0);
        }
        expect(await get('/ok', 4)).toEqual([200, 200, 200, 429]);
      });

      it('takes successful requests back with skipSuccessfulRequests', async () => {
        const { limiter, get } = await app({ skipSuccessfulRequests: true });
        const count = async () => (await limiter.getKey('127.0.0.1'))?.totalHits ?? 0;
        for (let i = 0; i < 5; i++) {
          expect(await get('/ok')).toEqual([200]);
          await eventually(count, 0);
        }
        expect(await get('/fail', 3)).toEqual([500, 500, 500]);
        expect(await get('/ok')).toEqual([429]);
        expect(await count()).toBe(4);
      });

      it('frees a client with resetKey from a handler', async () => {
        const { url, get } = await app();
        expect(await get('/ok', 4)).toEqual([200, 200, 200, 429]);
        expect((await send(url + '/reset', { method: 'POST' })).body).toBe('reset');
        expect(await get('/ok', 4)).toEqual([200, 200, 200, 429]);
      });

      it('answers getKey with the count and the window end, undefined for an unknown key', async () => {
        const { limiter, get } = await app();
        await get('/ok', 2);
        const info = await limiter.getKey('127.0.0.1');
        expect(info?.totalHits).toBe(2);
        expect(info?.resetTime).toBeInstanceOf(Date);
        expect(info!.resetTime!.getTime()).toBeGreaterThan(Date.now());
        expect(info!.resetTime!.getTime()).toBeLessThanOrEqual(Date.now() + 60_000);
        expect(await limiter.getKey('203.0.113.9')).toBeUndefined();
      });

      it('loses nothing under 2,000 parallel requests', async () => {
        const log = recorder();
        logged = log.logged;
        const limiter = rateLimit({
          store: expressStore({ store: create(), algorithm }),
          limit: 400,
          windowMs: 3_600_000,
          keyGenerator: (request) => String(request.headers['x-client']),
          logger: log.logger,
        });
        const app = express();
        app.use(limiter);
        app.get('/ok', (_request, response) => {
          response.send('ok');
        });
        const served = await serve(app);
        servers.push(served);
        const clients = Array.from({ length: 4 }, () => randomUUID());
        const requests = Array.from({ length: 2_000 }, (_, i) => clients[i % clients.length]);
        const replies = await Promise.all(
          requests.map((c) => send(served.url + '/ok', { headers: { 'x-client': c } })),
        );
        for (const c of clients) {
          const mine = replies.filter((_, i) => requests[i] === c);
          expect(mine.filter((r) => r.status === 200)).toHaveLength(400);
          expect(mine.filter((r) => r.status === 429)).toHaveLength(100);
          expect((await limiter.getKey(c))?.totalHits).toBe(500);
        }
      });

      it('says whether its keys are local: true over a memoryStore, false over a shared store', async () => {
        const store = create();
        expect(expressStore({ store }).localKeys).toBe(!store.shared);
      });
    });
  }
}
