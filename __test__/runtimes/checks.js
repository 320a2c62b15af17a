'use strict';
// The runtime suite's checks, in plain node:assert: run by run.js under Node.js 22 and 26, Bun and
// Deno (and by scripts/test-linux.js with the arm64 and musl binaries), with the targets to check in
// RATESTORE_TARGETS (JSON: [{ name, url, token?, ca?, cluster?, postgres?, mysql?, sqlite? }]). A child process runs
// behind RATESTORE_CHILD_PREFIX (JSON: an emulator's command and arguments, or []). Exits 0 when
// every check passed; any failure, abort or crash is seen by run.js.

const assert = require('node:assert/strict');
const { join } = require('node:path');
const { Worker } = require('node:worker_threads');
const { spawnSync } = require('node:child_process');
const ratestore = require('../..');
const { runtime } = require('../../lib/runtime.js');
const { storeFor } = require('./stores.js');

const { memoryStore, createLimiter, universalStore, expressStore } = ratestore;
const targets = JSON.parse(process.env.RATESTORE_TARGETS || '[]');
const run = `${Date.now()}-${Math.random().toString(36).slice(2)}`;

/** Every op of a store, with answers that could only come from a store that counts right. */
async function everyOp(store, label) {
  const k = (name) => `${run}:${label}:${name}`;
  assert.equal((await store.hit(k('hit'), 60_000, 1)).count, 1);
  assert.equal((await store.hit(k('hit'), 60_000, 2)).count, 3);
  const parallel = await Promise.all(
    Array.from({ length: 50 }, () => store.consume(k('c'), { limit: 20, windowMs: 60_000 })),
  );
  assert.equal(parallel.filter((a) => a.allowed).length, 20, `${label}: exactly the limit is allowed`);
  const refunded = await store.refund(k('c'), 5);
  assert.equal(refunded.count, 15);
  assert.equal((await store.consume(k('c'), { limit: 20, windowMs: 60_000, cost: 5 })).allowed, true);
  assert.equal((await store.consume(k('c'), { limit: 20, windowMs: 60_000 })).allowed, false);
  assert.equal((await store.slidingWindow.increment(k('s'), 60_000, 3)).count, 3);
  assert.equal((await store.slidingWindow.decrement(k('s'), 60_000, 1)).count, 2);
  const sliding = await store.slidingWindow.consume(k('s'), { limit: 3, windowMs: 60_000 });
  assert.deepEqual([sliding.allowed, sliding.count], [true, 3]);
  assert.equal((await store.slidingWindow.consume(k('s'), { limit: 3, windowMs: 60_000 })).allowed, false);
  const bucket = { capacity: 2, refill: 1, intervalMs: 60_000 };
  assert.deepEqual(
    (await Promise.all([0, 1, 2].map(() => store.tokenBucket(k('b'), bucket)))).map((a) => a.allowed).sort(),
    [false, true, true],
  );
  await store.reset(k('hit'));
  assert.equal((await store.hit(k('hit'), 60_000, 1)).count, 1);
  if (typeof store.ping === 'function') await store.ping();
  const stats = store.stats();
  assert.ok(stats.calls > 0, `${label}: stats counts calls`);
}

async function limiterAndAdapters(makeStore, label) {
  const limiter = createLimiter({ store: makeStore(), limit: 3, windowMs: 60_000 });
  const answers = [];
  for (let i = 0; i < 5; i++) answers.push((await limiter.check(`${run}:${label}:limiter`)).allowed);
  assert.deepEqual(answers, [true, true, true, false, false]);

  const universal = universalStore({ windowMs: 60_000, store: makeStore() });
  assert.equal((await universal.increment(`${run}:${label}:u`)).totalHits, 1);
  assert.equal((await universal.increment(`${run}:${label}:u`)).totalHits, 2);
  await universal.decrement(`${run}:${label}:u`);
  assert.equal((await universal.increment(`${run}:${label}:u`)).totalHits, 2);

  const express = require('express');
  const { rateLimit } = require('express-rate-limit');
  const app = express();
  app.use(
    rateLimit({
      windowMs: 60_000,
      limit: 2,
      store: expressStore({ store: makeStore(), prefix: `${run}:${label}:e:` }),
    }),
  );
  app.get('/', (_req, res) => res.send('ok'));
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  try {
    const url = `http://127.0.0.1:${server.address().port}/`;
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await fetch(url)).status);
    assert.deepEqual(statuses, [200, 200, 429], `${label}: express-rate-limit over expressStore`);
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
}

/** Four worker threads hit one key at once: every hit is counted once. */
async function workers(target) {
  const key = `${run}:${target.name}:workers`;
  const counts = await Promise.all(
    [0, 1, 2, 3].map(
      () =>
        new Promise((resolve, reject) => {
          const worker = new Worker(join(__dirname, 'worker.js'), { workerData: { target, key } });
          worker.once('message', resolve);
          worker.once('error', reject);
          worker.once('exit', (code) => code !== 0 && reject(new Error(`a worker exited with ${code}`)));
        }),
    ),
  );
  assert.deepEqual(
    counts.flat().sort((a, b) => a - b),
    Array.from({ length: 40 }, (_, i) => i + 1),
  );
}

/**
 * A child process that uses the store, then must exit by itself (an idle store holds nothing). Under
 * emulation (RATESTORE_CHILD_PREFIX: qemu-user), a forked child can deadlock inside the emulator before
 * its exec (a lock another emulated thread held at the fork), printing nothing and using no CPU: the
 * timeout kills it (SIGKILL: the emulator holds SIGTERM for a guest that never takes it), and such a
 * child, which never started idle.js, is started once more. Any other failure fails at once.
 */
function idleExit(target) {
  const prefix = JSON.parse(process.env.RATESTORE_CHILD_PREFIX || '[]');
  const [command, ...before] = [...prefix, process.execPath];
  let child;
  for (let attempt = 1; ; attempt++) {
    child = spawnSync(command, [...before, ...process.execArgv, join(__dirname, 'idle.js')], {
      env: { ...process.env, RATESTORE_TARGET: JSON.stringify(target) },
      encoding: 'utf8',
      timeout: 120_000,
      killSignal: 'SIGKILL',
    });
    const neverStarted = child.error?.code === 'ETIMEDOUT' && child.stdout === '' && child.stderr === '';
    if (!(neverStarted && prefix.length > 0 && attempt < 2)) break;
    console.error(`${target.name}: the idle child hung in the emulator before it started; starting it again`);
  }
  assert.equal(child.error, undefined, `${target.name}: the idle child exits by itself (${child.error})`);
  assert.equal(child.signal, null, `${target.name}: the idle child was not killed by a signal: ${child.stderr}`);
  assert.equal(child.status, 0, `${target.name}: the idle child exits 0: ${child.stderr}`);
  assert.match(child.stdout, /^done$/m);
}

function makeStore(target) {
  return () => storeFor(target);
}

async function main() {
  const done = [];
  const memory = memoryStore();
  await everyOp(memory, 'memory');
  await limiterAndAdapters(() => memoryStore(), 'memory');
  await workers({ name: 'memory' });
  idleExit({ name: 'memory' });
  done.push('memory');

  for (const target of targets) {
    const make = makeStore(target);
    const store = make();
    await everyOp(store, target.name);
    await limiterAndAdapters(make, target.name);
    await workers(target);
    idleExit(target);
    await store.resetAll();
    assert.equal((await store.hit(`${run}:${target.name}:hit`, 60_000, 1)).count, 1, 'resetAll emptied the prefix');
    await store.close();
    await assert.rejects(store.hit('k', 1000, 1), (e) => e.code === 'ERR_CLOSED');
    done.push(target.name);
  }
  // Which binary the loader chose, by its file name (a runtime without require.cache says so).
  const cache = typeof require.cache === 'object' && require.cache !== null ? Object.keys(require.cache) : [];
  const binary =
    cache
      .find((file) => file.endsWith('.node'))
      ?.split(/[\\/]/)
      .pop() ?? 'binary not listed';
  console.log(`${runtime.name} ${runtime.version} ${process.arch} (${binary}): ${done.join(', ')}: ok`);
}

main().catch((error) => {
  console.error(error.stack);
  console.error(error);
  process.exit(1);
});
