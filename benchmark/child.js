'use strict';
// One store in a fresh process, for the scenarios that a shared heap would
// blur: `footprint NAME COUNT` (RSS growth for COUNT distinct keys hit once),
// `stall NAME FROM TO` (per-hit latency while growing from FROM to TO
// counters) and `full CASE COUNT HITS` (per-hit latency of HITS fresh keys
// on a memoryStore holding COUNT counters; CASE is room, evicts, refused or
// invalid).
// NAME "keys only" generates the keys and keeps nothing: the footprint
// baseline. Prints one JSON line. Run with node --expose-gc.

const { performance } = require('node:perf_hooks');
const ratestore = require('..');
const { memoryStores, turnover, WINDOW_MS } = require('./stores.js');
const { sorted, quantile } = require('./stats.js');

/** The i-th distinct 64-character key, made on the fly so no key array is kept. */
const PREFIX = 'ratelimit:chat:user:0123456789abcdef0123456789abcdef:';
const key = (i) => `${PREFIX}${i.toString(36).padStart(64 - PREFIX.length, '0')}`;

const keysOnly = { name: 'keys only', create: () => ({ hit: (k) => Promise.resolve(k.length) }) };

const HOUR = 3_600_000;
/**
 * The full-store cases: the store, the window its counters are opened with, and the code a fresh key's hit rejects
 * with, if any. A 1-hour window is the longest that a full store evicts; a 2-hour one is a budget it keeps, so a
 * fresh key is refused. `invalid` is the floor of a rejected hit: a windowMs of 0, refused by the JS checks.
 */
const room = (count) => ratestore.memoryStore({ maxKeys: 2 * count });
const full = (count) => ratestore.memoryStore({ maxKeys: count });
const FULL = {
  room: { windowMs: 2 * HOUR, create: room },
  evicts: { windowMs: HOUR, create: full },
  refused: { windowMs: 2 * HOUR, create: full, code: 'ERR_STORE_FULL' },
  invalid: { windowMs: 2 * HOUR, create: room, code: 'ERR_OUT_OF_RANGE', hitWindowMs: 0 },
};

function settle() {
  for (let i = 0; i < 3; i++) global.gc();
  return process.memoryUsage();
}

function percentiles(latencies) {
  const s = sorted(latencies);
  const us = (q) => quantile(s, q) * 1000;
  return { p50: us(0.5), p99: us(0.99), p999: us(0.999), max: s[s.length - 1] * 1000 };
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
  return percentiles(latencies);
}

async function fresh(which, count, hits) {
  const { windowMs, create, code, hitWindowMs = windowMs } = FULL[which];
  const store = create(count);
  for (let i = 0; i < count; i++) await store.hit(key(i), windowMs, 1);
  settle();
  const latencies = new Float64Array(hits);
  for (let i = 0; i < hits; i++) {
    const k = key(count + i);
    const start = performance.now();
    const error = await store.hit(k, hitWindowMs, 1).then(
      () => undefined,
      (e) => e,
    );
    latencies[i] = performance.now() - start;
    if (error?.code !== code) throw error ?? new Error(`a fresh key's hit did not reject with ${code}`);
  }
  return percentiles(latencies);
}

async function main() {
  if (typeof global.gc !== 'function') throw new Error('run with node --expose-gc');
  const [scenario, name, ...sizes] = process.argv.slice(2);
  const [a, b] = sizes.map(Number);
  if (scenario === 'full') {
    process.stdout.write(`${JSON.stringify(await fresh(name, a, b))}\n`);
    return;
  }
  const spec = [...memoryStores, turnover, keysOnly].find((s) => s.name === name);
  if (!spec) throw new Error(`no store named ${name}`);
  const store = spec.create(a);
  const result = scenario === 'footprint' ? await footprint(store, a) : await stall(store, a, b);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  store.close?.();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
