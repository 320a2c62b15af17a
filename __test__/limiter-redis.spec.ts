// What a check costs on Redis, counted by the server itself (INFO commandstats): one script per
// limit, and a refused request one call that changes nothing.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLimiter, redisStore, type RedisStore } from '../index.js';
import { scriptsRun, startRedis, type RedisServer } from './support/redis.js';

let server: RedisServer;
let store: RedisStore;

beforeAll(async () => {
  server = await startRedis();
  store = redisStore({ url: server.url, prefix: 'limiter:' });
});

afterAll(async () => {
  await store?.close();
  await server?.stop();
});

const scripts = () => scriptsRun(server);

async function costOf(check: () => Promise<unknown>): Promise<number> {
  const before = await scripts();
  await check();
  return (await scripts()) - before;
}

describe('createLimiter over redisStore', () => {
  it('allows and refuses in one script each; a refusal changes nothing', async () => {
    const limiter = createLimiter({ store, limit: 1, windowMs: 60_000 });
    const key = randomUUID();
    expect(await costOf(() => limiter.check(key))).toBe(1);
    expect(await costOf(() => limiter.check(key))).toBe(1);
    expect(await server.cli('GET', `limiter:${key}`)).toBe('1');
  });

  it('checks several windows as one script, which leaves every key as it was when one refuses', async () => {
    const limiter = createLimiter({
      store,
      limits: [
        { name: 'burst', limit: 1, windowMs: 60_000 },
        { name: 'daily', limit: 5, windowMs: 86_400_000 },
      ],
    });
    const key = randomUUID();
    expect(await costOf(() => limiter.check(key))).toBe(1);
    // burst refuses: the same one script puts daily back as it was; nothing is given back after.
    expect(await costOf(() => limiter.check(key))).toBe(1);
    expect(await server.cli('GET', `limiter:${key}:burst`)).toBe('1');
    expect(await server.cli('GET', `limiter:${key}:daily`)).toBe('1');
  });
});
