// The benchmark is not run by `npm test` (it takes minutes); its smoke mode
// is, with tiny sizes and no timing checks, so that no scenario can rot.
import { execFile } from 'node:child_process';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const root = join(__dirname, '..');
const results = join(root, 'benchmark', 'RESULTS.md');
const mtime = (path: string) => statSync(path, { throwIfNoEntry: false })?.mtimeMs;

describe('npm run bench -- --smoke', () => {
  it('runs every scenario end to end and prints a table for each', { timeout: 180_000 }, async () => {
    const before = mtime(results);
    const { stdout } = await promisify(execFile)(
      process.execPath,
      ['--expose-gc', join(root, 'benchmark', 'run.js'), '--smoke'],
      { cwd: root, maxBuffer: 1 << 22 },
    );
    const titles = [...stdout.matchAll(/^### (.+)$/gm)].map((m) => m[1]);
    expect(titles).toEqual([
      expect.stringMatching(/^Sequential/),
      expect.stringMatching(/^100 in flight/),
      expect.stringMatching(/^Footprint/),
      expect.stringMatching(/^Stall/),
      expect.stringMatching(/^Full store/),
      expect.stringMatching(/^Worker threads/),
      expect.stringMatching(/^Redis, 1 in flight/),
      expect.stringMatching(/^Redis, 16 in flight/),
      expect.stringMatching(/^Redis, 256 in flight/),
      expect.stringMatching(/^Redis with a replica, 1 in flight/),
      expect.stringMatching(/^Redis with a replica, 16 in flight/),
      expect.stringMatching(/^Redis with a replica, 256 in flight/),
      expect.stringMatching(/^Redis Cluster, 256 in flight/),
      expect.stringMatching(/^Consume in memory/),
      expect.stringMatching(/^Consume on Redis/),
      expect.stringMatching(/^Flood, 1 key/),
      expect.stringMatching(/^Flood, 1,000 keys/),
      expect.stringMatching(/^REST, 1 in flight/),
      expect.stringMatching(/^REST, 256 in flight/),
      expect.stringMatching(/^CPU per hit/),
      expect.stringMatching(/^PostgreSQL, 1 in flight/),
      expect.stringMatching(/^PostgreSQL, 16 in flight/),
      expect.stringMatching(/^PostgreSQL, 256 in flight:/),
      expect.stringMatching(/^PostgreSQL, 256 in flight on one hot key/),
      expect.stringMatching(/^PostgreSQL, paced/),
      expect.stringMatching(/^SQLite, 1 in flight/),
      expect.stringMatching(/^SQLite, 16 in flight/),
      expect.stringMatching(/^SQLite, 256 in flight:/),
      expect.stringMatching(/^SQLite, 256 in flight on one hot key/),
      expect.stringMatching(/^MariaDB .*, 1 in flight/),
      expect.stringMatching(/^MariaDB .*, 16 in flight/),
      expect.stringMatching(/^MariaDB .*, 256 in flight:/),
      expect.stringMatching(/^MariaDB .*, 256 in flight on one hot key/),
    ]);
    for (const store of [
      'JS Map store',
      'express-rate-limit MemoryStore',
      'rate-limiter-flexible RateLimiterMemory',
      'memoryStore()',
      'memoryStore(), full: turns over',
      'memoryStore({ name }), 4 worker threads',
      'ioredis EVALSHA',
      'node-redis 5 EVALSHA',
      'Valkey GLIDE 2 invokeScript',
      'rate-limiter-flexible RateLimiterRedis',
      'redisStore()',
      'limit: redis-benchmark EVALSHA -P 16',
      'node-redis 5 EVALSHA, then WAIT 1',
      'redisStore(), no wait',
      'redisStore({ waitForReplicas: 1 })',
      'ioredis Cluster EVALSHA',
      'redisStore({ cluster: true })',
      '@upstash/redis EVALSHA',
      'redisStore() over REST',
      'createLimiter over redisStore(), block cache (default)',
      'createLimiter over redisStore(), blockCache: false',
      'rate-limiter-flexible RateLimiterRedis, inMemoryBlockOnConsumed',
      "pg Pool, seed 000's upsert",
      'rate-limiter-flexible RateLimiterPostgres',
      "postgres (postgres.js), seed 000's upsert",
      'postgresStore()',
      'limit: pgbench -M prepared -c 64',
      'rate-limiter-flexible RateLimiterSQLite',
      "node:sqlite, seed 001's upsert",
      'sqliteStore()',
      'mysqlStore()',
      "mysql2 pool, mysqlStore's CALL",
      'rate-limiter-flexible RateLimiterMySQL',
    ]) {
      expect(stdout).toContain(`| ${store} |`);
    }
    // Every measured cell is a number: a store that failed would have stopped the run.
    expect(stdout).not.toMatch(/\| NaN|undefined/);
    expect(stdout).toMatch(/^Targets \(smoke run\):/m);
    // Only a full run writes the results file.
    expect(mtime(results)).toBe(before);
  });
});
