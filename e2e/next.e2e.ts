// examples/next-app as a user deploys it: the packed tarballs installed into a copy of the app,
// `next build` with no Redis variables, then `next start` instances answering real requests.
import { cpSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { startRedis } from '../__test__/support/redis.js';
import { startRest } from '../__test__/support/rest.js';
import {
  cleanEnv,
  exec,
  freePort,
  npmInstall,
  packTarballs,
  removeDir,
  root,
  run,
  Server,
  sleep,
  stopAll,
  tempDir,
} from './support.js';

const LIMIT = 3;
const work = tempDir('next');
const app = join(work, 'app');
const next = join(app, 'node_modules', 'next', 'dist', 'bin', 'next');

beforeAll(async () => {
  const tarballs = await packTarballs(work);
  const source = join(root, 'examples', 'next-app');
  const skip = new Set(['node_modules', '.next', 'next-env.d.ts'].map((name) => join(source, name)));
  cpSync(source, app, { recursive: true, filter: (path) => !skip.has(path) });
  // The app's lock pins next and react; the two tarballs come on top, as `npm install ratestore` would.
  await npmInstall(app, [tarballs.root, tarballs.platform]);
}, 300_000);

afterAll(async () => {
  await stopAll();
  removeDir(work);
});

/** `next start` on a free loopback port, ready for requests. */
async function startNext(env: Record<string, string>): Promise<{ base: string; server: Server }> {
  const port = await freePort();
  const server = new Server(process.execPath, [next, 'start', '-p', String(port), '-H', '127.0.0.1'], {
    cwd: app,
    env: cleanEnv(env),
  });
  await server.waitFor(/Ready in/, 60_000);
  return { base: `http://127.0.0.1:${port}`, server };
}

/** One request as the client `client` (its address, as a proxy reports it in x-forwarded-for). */
async function get(base: string, route: string, client: string) {
  const response = await fetch(`${base}${route}`, { headers: { 'x-forwarded-for': client } });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

describe('examples/next-app', () => {
  it('builds with no Redis variables set', async () => {
    const output = await run(process.execPath, [next, 'build'], { cwd: app, env: cleanEnv() });
    expect(output).toMatch(/ƒ \/api\/memory/);
    expect(output).toMatch(/ƒ \/api\/redis/);
  }, 300_000);

  it('limits the memoryStore route: 200s with headers, then 429 with Retry-After, then 200s again', async () => {
    const { base } = await startNext({ RATE_LIMIT: String(LIMIT), RATE_WINDOW_MS: '2000' });
    const client = '198.51.100.1';
    for (let remaining = LIMIT - 1; remaining >= 0; remaining--) {
      const answer = await get(base, '/api/memory', client);
      expect(answer.status).toBe(200);
      expect(answer.body).toEqual({ store: 'memory', remaining });
      expect(answer.headers.get('ratelimit-limit')).toBe(String(LIMIT));
      expect(answer.headers.get('ratelimit-remaining')).toBe(String(remaining));
      expect(Number(answer.headers.get('ratelimit-reset'))).toBeGreaterThanOrEqual(1);
      expect(answer.headers.get('retry-after')).toBeNull();
    }
    const refused = await get(base, '/api/memory', client);
    expect(refused.status).toBe(429);
    const retryAfter = Number(refused.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(2);
    // Another client has its own counter.
    expect((await get(base, '/api/memory', '198.51.100.2')).status).toBe(200);

    await sleep(retryAfter * 1000);
    const again = await get(base, '/api/memory', client);
    expect(again.status).toBe(200);
    expect(again.body).toEqual({ store: 'memory', remaining: LIMIT - 1 });
  });

  it('refuses on the redisStore route with 503 when no Redis URL is set, naming the variables', async () => {
    const { base, server } = await startNext({});
    const answer = await get(base, '/api/redis', '198.51.100.3');
    expect(answer.status).toBe(503);
    expect(answer.body).toEqual({ error: 'rate limiter unavailable' });
    await server.waitFor(/REDIS_URL/, 5_000);
  });

  it('shares the redisStore counters between two instances: exactly `limit` requests pass in total', async () => {
    const redis = await startRedis();
    onTestFinished(() => redis.stop());
    const env = { REDIS_URL: redis.url, RATE_LIMIT: String(LIMIT), RATE_WINDOW_MS: '30000' };
    const instances = (await Promise.all([startNext(env), startNext(env)])).map(({ base }) => base);
    // Each instance loads the route and connects once, on a client of its own.
    for (const [i, base] of instances.entries())
      expect((await get(base, '/api/redis', `warm-up-${i}`)).status).toBe(200);

    const statuses = [];
    for (let i = 0; i < 4 * LIMIT; i++) {
      const answer = await get(instances[i % 2], '/api/redis', '198.51.100.4');
      if (answer.status === 200) expect(answer.body.store).toBe('redis');
      statuses.push(answer.status);
    }
    expect(statuses).toEqual([...Array(LIMIT).fill(200), ...Array(3 * LIMIT).fill(429)]);
  });

  it('shares the counters over Upstash REST with only UPSTASH_REDIS_REST_URL and _TOKEN set', async () => {
    const redis = await startRedis();
    onTestFinished(() => redis.stop());
    const rest = await startRest({ redisPort: redis.port, token: 'e2e-rest-token' });
    onTestFinished(() => rest.stop());
    const env = {
      UPSTASH_REDIS_REST_URL: rest.url,
      UPSTASH_REDIS_REST_TOKEN: rest.token,
      RATE_LIMIT: String(LIMIT),
      RATE_WINDOW_MS: '30000',
    };
    const instances = (await Promise.all([startNext(env), startNext(env)])).map(({ base }) => base);
    const statuses = [];
    for (let i = 0; i < 4 * LIMIT; i++) {
      const answer = await get(instances[i % 2], '/api/redis', '198.51.100.5');
      if (answer.status === 200) expect(answer.body.store).toBe('redis');
      statuses.push(answer.status);
    }
    expect(statuses).toEqual([...Array(LIMIT).fill(200), ...Array(3 * LIMIT).fill(429)]);
    // Every hit went through the endpoint, none over the Redis protocol.
    expect((await rest.stats()).commands).toBeGreaterThanOrEqual(4 * LIMIT);
  });

  // Last: it replaces the build the tests above ran against.
  it('does not build without serverExternalPackages, as the README says', async () => {
    writeFileSync(join(app, 'next.config.ts'), 'export default {};\n');
    const output = await exec(process.execPath, [next, 'build'], { cwd: app });
    expect(output.code).not.toBe(0);
    expect(output.stdout + output.stderr).toMatch(/ratestore\.[\w-]+\.node \(node addon\) is not placeable/);
  }, 300_000);
});
