// examples/next-app as a user deploys it: the packed tarballs installed into a copy of the app,
// `next build` with no Redis variables, then `next start` instances answering real requests; on
// Node.js, then on Bun (`bun --bun next build`, `bun --bun next start`), each in a copy of its own
// made from the one install.
import { cpSync, mkdirSync, readFileSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { installed } from '../scripts/runtimes.js';
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

/** How one runtime runs the app's `next` command: `command ...args <next's arguments>` in `app`. */
interface NextRuntime {
  name: string;
  app: string;
  command: () => string;
  args: string[];
}

const onNode: NextRuntime = { name: 'Node.js', app, command: () => process.execPath, args: [next] };
// As a Bun user types it: `bun --bun next start` runs the app's next bin on Bun, not on node.
const onBun: NextRuntime = {
  name: 'Bun',
  app: join(work, 'app-bun'),
  command: () => installed('bun').path,
  args: ['--bun', 'next'],
};

beforeAll(async () => {
  const tarballs = await packTarballs(work);
  const source = join(root, 'examples', 'next-app');
  const skip = new Set(['node_modules', '.next', 'next-env.d.ts'].map((name) => join(source, name)));
  cpSync(source, app, { recursive: true, filter: (path) => !skip.has(path) });
  // The app's lock pins next and react; the two tarballs come on top, as `npm install ratestore` would.
  await npmInstall(app, [tarballs.root, tarballs.platform]);
  // Bun's copy, before anything is built: the same installed packages, a build of its own.
  cpSync(app, onBun.app, { recursive: true, verbatimSymlinks: true });
}, 300_000);

afterAll(async () => {
  await stopAll();
  removeDir(work);
});

/** `next start` on a free loopback port, ready for requests. */
async function startNext(runtime: NextRuntime, env: Record<string, string>): Promise<{ base: string; server: Server }> {
  const port = await freePort();
  const server = new Server(runtime.command(), [...runtime.args, 'start', '-p', String(port), '-H', '127.0.0.1'], {
    cwd: runtime.app,
    env: cleanEnv(env),
  });
  await server.waitFor(/Ready in/, 60_000);
  // Every process of the server is the runtime under test: none of them is a node started along the way.
  expect(server.executables()).toEqual(new Set([realpathSync(runtime.command())]));
  return { base: `http://127.0.0.1:${port}`, server };
}

/** One request from the client `client`, whose address the proxy in front appends to x-forwarded-for. */
async function get(base: string, route: string, client: string, sent?: string) {
  const forwarded = sent === undefined ? client : `${sent}, ${client}`;
  const response = await fetch(`${base}${route}`, { headers: { 'x-forwarded-for': forwarded } });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

/** What an allowed answer must carry: the limiter's draft-6 headers, and no Retry-After. */
function expectHeaders(headers: Headers, remaining: number): void {
  expect(headers.get('ratelimit-limit')).toBe(String(LIMIT));
  expect(headers.get('ratelimit-remaining')).toBe(String(remaining));
  expect(Number(headers.get('ratelimit-reset'))).toBeGreaterThanOrEqual(1);
  expect(headers.get('ratelimit-policy')).toMatch(new RegExp(`^${LIMIT};w=\\d+$`));
  expect(headers.get('retry-after')).toBeNull();
}

describe('the README', () => {
  it('has TypeScript samples that compile with tsc --strict against the installed package and Next.js', async () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    const blocks = [...readme.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]);
    expect(blocks.length).toBeGreaterThanOrEqual(10);
    // Beside the app, whose node_modules hold ratestore, next and @types/node; each sample a module of its own.
    const dir = join(work, 'readme');
    mkdirSync(dir);
    symlinkSync(join(app, 'node_modules'), join(dir, 'node_modules'));
    blocks.forEach((code, i) => writeFileSync(join(dir, `sample-${i + 1}.ts`), `${code}\nexport {};\n`));
    // The samples of other libraries import them: their types come from this checkout's dev dependencies.
    const devTypes = (name: string) => [join(root, 'node_modules', name)];
    const compilerOptions = {
      strict: true,
      noEmit: true,
      target: 'es2022',
      module: 'esnext',
      moduleResolution: 'bundler',
      lib: ['es2022', 'dom'],
      types: ['node'],
      skipLibCheck: true,
      paths: {
        express: devTypes('@types/express'),
        'express-rate-limit': devTypes('express-rate-limit'),
        '@opentelemetry/api': devTypes('@opentelemetry/api'),
        // Not on the registry: the Store interface and driver the tests write from its documentation.
        'universal-rate-limit': [join(root, '__test__', 'support', 'universal.ts')],
      },
    };
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions, include: ['*.ts'] }));
    const tsc = join(app, 'node_modules', 'typescript', 'bin', 'tsc');
    const output = await exec(process.execPath, [tsc, '-p', dir], { cwd: dir });
    expect(output.code, output.stdout + output.stderr).toBe(0);
  });
});

/** What the app does alike on every runtime: the build, memoryStore, and redisStore shared by two instances. */
function servesOn(runtime: NextRuntime): void {
  it('builds with no Redis variables set', async () => {
    const output = await run(runtime.command(), [...runtime.args, 'build'], { cwd: runtime.app, env: cleanEnv() });
    expect(output).toMatch(/ƒ \/api\/hello/);
    expect(output).toMatch(/ƒ \/limited/);
    expect(output).toMatch(/Proxy/);
  }, 300_000);

  it('limits /api/* in proxy.ts and a route handler: headers, then 429 with Retry-After, then 200s again', async () => {
    const { base } = await startNext(runtime, { RATE_LIMIT: String(LIMIT), RATE_WINDOW_MS: '2000' });
    const client = '198.51.100.1';
    for (let remaining = LIMIT - 1; remaining >= 0; remaining--) {
      const answer = await get(base, '/api/hello', client);
      expect(answer.status).toBe(200);
      expect(answer.body).toEqual({ hello: 'world' });
      expectHeaders(answer.headers, remaining);
    }
    const refused = await get(base, '/api/hello', client);
    expect(refused.status).toBe(429);
    expect(refused.body).toEqual({ error: 'too many requests' });
    const retryAfter = Number(refused.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(2);
    expect(refused.headers.get('ratelimit-remaining')).toBe('0');
    // Addresses the client adds to x-forwarded-for itself do not give it another key.
    expect((await get(base, '/api/hello', client, '203.0.113.50')).status).toBe(429);
    // Another client has its own counter.
    expect((await get(base, '/api/hello', '198.51.100.2')).status).toBe(200);

    // The route handler's own limiter, on its own counters.
    for (let remaining = LIMIT - 1; remaining >= 0; remaining--) {
      const answer = await get(base, '/limited', client);
      expect(answer.body).toEqual({ version: 1, remaining });
      expectHeaders(answer.headers, remaining);
    }
    expect((await get(base, '/limited', client)).status).toBe(429);

    await sleep(retryAfter * 1000);
    const again = await get(base, '/api/hello', client);
    expect(again.status).toBe(200);
    expect(again.headers.get('ratelimit-remaining')).toBe(String(LIMIT - 1));
  });

  it('answers 503 from the proxy when RATE_STORE=redis has no Redis URL, naming the variables', async () => {
    const { base, server } = await startNext(runtime, { RATE_STORE: 'redis' });
    const answer = await get(base, '/api/hello', '198.51.100.3');
    expect(answer.status).toBe(503);
    expect(answer.body).toEqual({ error: 'rate limiter unavailable' });
    await server.waitFor(/REDIS_URL/, 5_000);
  });

  it('shares the counters of two instances through redis-server: exactly `limit` requests pass in total', async () => {
    const redis = await startRedis();
    onTestFinished(() => redis.stop());
    const env = { RATE_STORE: 'redis', REDIS_URL: redis.url, RATE_LIMIT: String(LIMIT), RATE_WINDOW_MS: '30000' };
    const instances = (await Promise.all([startNext(runtime, env), startNext(runtime, env)])).map(({ base }) => base);
    // Each instance loads the proxy and connects once, on a client of its own.
    for (const [i, base] of instances.entries())
      expect((await get(base, '/api/hello', `192.0.2.${i + 1}`)).status).toBe(200);

    const statuses = [];
    for (let i = 0; i < 4 * LIMIT; i++) {
      const answer = await get(instances[i % 2], '/api/hello', '198.51.100.4');
      if (answer.status === 200) expectHeaders(answer.headers, LIMIT - 1 - i);
      else expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
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
      RATE_STORE: 'redis',
      UPSTASH_REDIS_REST_URL: rest.url,
      UPSTASH_REDIS_REST_TOKEN: rest.token,
      RATE_LIMIT: String(LIMIT),
      RATE_WINDOW_MS: '30000',
    };
    const instances = (await Promise.all([startNext(runtime, env), startNext(runtime, env)])).map(({ base }) => base);
    const statuses = [];
    for (let i = 0; i < 4 * LIMIT; i++) {
      const answer = await get(instances[i % 2], '/api/hello', '198.51.100.5');
      if (answer.status === 200) expectHeaders(answer.headers, LIMIT - 1 - i);
      statuses.push(answer.status);
    }
    expect(statuses).toEqual([...Array(LIMIT).fill(200), ...Array(3 * LIMIT).fill(429)]);
    // Every hit went through the endpoint, none over the Redis protocol.
    expect((await rest.stats()).commands).toBeGreaterThanOrEqual(4 * LIMIT);
  });
}

describe('examples/next-app on Node.js', () => {
  servesOn(onNode);

  it("keeps a route handler's counts across a hot reload in next dev, with memoryStore({ name })", async () => {
    const port = await freePort();
    const server = new Server(process.execPath, [next, 'dev', '-p', String(port), '-H', '127.0.0.1'], {
      cwd: app,
      env: cleanEnv({ RATE_LIMIT: '100' }),
    });
    await server.waitFor(/Ready in/, 60_000);
    const base = `http://127.0.0.1:${port}`;
    const answers: { version: number; remaining: number }[] = [];
    const request = async () => {
      const answer = await get(base, '/limited', '198.51.100.5');
      expect(answer.status, server.log).toBe(200);
      answers.push(answer.body);
      return answer.body;
    };
    await request();
    await request();
    // An edit of the route: the dev server evaluates its module again, which makes a new store.
    const route = join(app, 'app', 'limited', 'route.ts');
    writeFileSync(route, readFileSync(route, 'utf8').replace('const VERSION = 1;', 'const VERSION = 2;'));
    const deadline = Date.now() + 30_000;
    while ((await request()).version !== 2) {
      expect(Date.now(), 'the dev server did not reload the route').toBeLessThan(deadline);
      await sleep(250);
    }
    // Every request counted once, across the reload: the named store kept its counters.
    expect(answers.map((a) => a.remaining)).toEqual(answers.map((_, i) => 99 - i));
    await server.stop();
  }, 90_000);

  // Last: it replaces the build the tests above ran against.
  it('does not build without serverExternalPackages, as the README says', async () => {
    writeFileSync(join(app, 'next.config.ts'), 'export default {};\n');
    const output = await exec(process.execPath, [next, 'build'], { cwd: app });
    expect(output.code).not.toBe(0);
    expect(output.stdout + output.stderr).toMatch(/ratestore\.[\w-]+\.node \(node addon\) is not placeable/);
  }, 300_000);
});

describe('examples/next-app on Bun: bun --bun next build, bun --bun next start', () => {
  // A missing Bun fails each test here (onBun.command() throws, saying how to install it): none skips.
  servesOn(onBun);
});
