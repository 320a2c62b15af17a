'use strict';
// One store in a fresh process, for the scenarios that a shared heap would
// blur: `footprint NAME COUNT` (RSS growth for COUNT distinct keys hit once)
// and `stall NAME FROM TO` (per-hit latency while growing from FROM to TO
// counters). NAME "keys only" generates the keys and keeps nothing: the
// footprint baseline. Prints one JSON line. Run with node --expose-gc.

const { performance } = require('node:perf_hooks');
const { memoryStores, WINDOW_MS } = require('./stores.js');
const { sorted, quantile } = require('./stats.js');

/** The i-th distinct 64-character key, made on the fly so no key array is kept. */
const PREFIX = 'ratelimit:chat:user:0123456789abcdef0123456789abcdef:';
const key = (i) => `${PREFIX}${i.toString(36).padStart(64 - PREFIX.length, '0')}`;

const keysOnly = { name: 'keys only', create: () => ({ hit: (k) => Promise.resolve(k.length) }) };

function settle() {
  for (let i = 0; i < 3; i++) global.gc();
  return process.memoryUsage();
}

async function footprint(store, count) {
  const before = settle();
  for (let i = 0; i < count; i++) await store.hit(key(i), WINDOW_MS, 1);
  const after = settle();
  return { rss: after.rss - before.rss, heap: after.heapUsed - before.heapUsed, count };
}

async function stall(store, from, to) {
  for (let i = 0; i < from; i++) await store.hit(key(i), WINDOW_MS, 1);
  settle();
  const latencies = new Float64Array(to - from);
  for (let i = from; i < to; i++) {
    const k = key(i);
    const start = performance.now();
    await store.hit(k, WINDOW_MS, 1);
    latencies[i - from] = performance.now() - start;
  }
  const s = sorted(latencies);
  const us = (q) => quantile(s, q) * 1000;
  return { p50: us(0.5), p99: us(0.99), p999: us(0.999), max: s[s.length - 1] * 1000 };
}

async function main() {
  if (typeof global.gc !== 'function') throw new Error('run with node --expose-gc');
  const [scenario, name, ...sizes] = process.argv.slice(2);
  const spec = [...memoryStores, keysOnly].find((s) => s.name === name);
  if (!spec) throw new Error(`no store named ${name}`);
  const store = spec.create();
  const [a, b] = sizes.map(Number);
  const result = scenario === 'footprint' ? await footprint(store, a) : await stall(store, a, b);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  store.close?.();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
