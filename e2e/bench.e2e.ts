// The benchmark on Bun and Deno (`npm run bench -- --runtime=bun`), in smoke mode: every scenario at
// tiny sizes, no timing checks, so that the rows RESULTS.md reports for those runtimes can be made
// again, and the run ends by itself. A runtime that is not installed fails here, saying how to install it.
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { root, run } from './support.js';

const results = join(root, 'benchmark', 'RESULTS.md');

describe.each([
  { name: 'bun', label: 'Bun' },
  { name: 'deno', label: 'Deno' },
])('npm run bench -- --runtime=$name --smoke', ({ name, label }) => {
  it('runs every scenario on that runtime and ends by itself', async () => {
    const before = statSync(results).mtimeMs;
    const bench = join(root, 'benchmark', 'run.js');
    // A run that does not end (a process it started left running) is killed, and fails.
    const stdout = await run(process.execPath, ['--expose-gc', bench, `--runtime=${name}`, '--smoke'], {
      cwd: root,
      timeoutMs: 200_000,
    });
    // The run says which runtime ran it, and it is that one (process.versions, not the parent's).
    expect(stdout).toMatch(new RegExp(`^ratestore benchmark \\(smoke\\): .*; ${label} \\d+\\.\\d+\\.\\d+$`, 'm'));
    const titles = [...stdout.matchAll(/^### (.+)$/gm)].map((m) => m[1]);
    expect(titles).toEqual(
      [
        /^Sequential/,
        /^100 in flight/,
        /^Footprint/,
        /^Stall/,
        /^Full store/,
        /^Worker threads/,
        /^Redis, 1 in flight/,
        /^Redis, 16 in flight/,
        /^Redis, 256 in flight/,
        /^Redis with a replica, 1 in flight/,
        /^Redis with a replica, 16 in flight/,
        /^Redis with a replica, 256 in flight/,
        /^Redis Cluster, 256 in flight/,
        /^Consume in memory/,
        /^Consume on Redis/,
        /^Flood, 1 key:/,
        /^Flood, 1,000 keys:/,
        /^REST, 1 in flight/,
        /^REST, 256 in flight/,
        /^CPU per hit/,
        /^PostgreSQL, 1 in flight/,
        /^PostgreSQL, 16 in flight/,
        /^PostgreSQL, 256 in flight:/,
        /^PostgreSQL, 256 in flight on one hot key/,
        /^PostgreSQL, paced/,
        /^MariaDB .*, 1 in flight/,
        /^MariaDB .*, 16 in flight/,
        /^MariaDB .*, 256 in flight:/,
        /^MariaDB .*, 256 in flight on one hot key/,
      ].map((title) => expect.stringMatching(title)),
    );
    for (const store of [
      'memoryStore()',
      'redisStore()',
      'node-redis 5 EVALSHA',
      'ioredis EVALSHA',
      'postgresStore()',
      'redisStore({ waitForReplicas: 1 })',
    ])
      expect(stdout).toContain(`| ${store} |`);
    // The CPU table: a row per store under each load, memoryStore's among them.
    for (const store of ['redisStore()', 'node-redis 5 EVALSHA', 'ioredis EVALSHA', 'memoryStore()'])
      expect(stdout).toMatch(
        new RegExp(`^\\| saturated, 16 in flight \\| ${store.replace(/[()]/g, '\\$&')} \\| \\d`, 'm'),
      );
    expect(stdout).not.toMatch(/\| NaN|undefined/);
    // Only a full run on Node.js writes the results file.
    expect(statSync(results).mtimeMs).toBe(before);
  }, 220_000);
});
