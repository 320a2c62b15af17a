'use strict';
// A worker thread of the workers scenario: opens the named memoryStore, says
// it is ready, and on "go" makes `hits` awaited hits over `keys` keys from
// its own offset, then reports the milliseconds they took.
const { parentPort, workerData } = require('node:worker_threads');
const { performance } = require('node:perf_hooks');
const { memoryStore } = require('..');

const { name, hits, keys, offset, windowMs } = workerData;
const store = memoryStore({ name });
const KEYS = Array.from({ length: keys }, (_, i) => `ratelimit:chat:ip:10.0.${i >> 8}.${i & 255}`);

parentPort.once('message', async () => {
  const start = performance.now();
  for (let i = 0; i < hits; i++) await store.hit(KEYS[(offset + i) % keys], windowMs, 1);
  parentPort.postMessage(performance.now() - start);
});
parentPort.postMessage('ready');
