'use strict';
// One worker thread of checks.js: ten hits on one key, answering the counts it saw.
const { parentPort, workerData } = require('node:worker_threads');
const { readFileSync } = require('node:fs');
const { memoryStore, redisStore } = require('../..');

const { target, key } = workerData;
const store =
  target.name === 'memory'
    ? memoryStore({ name: key })
    : redisStore({
        url: target.url,
        token: target.token,
        cluster: target.cluster,
        tls: target.ca ? { ca: readFileSync(target.ca, 'utf8') } : undefined,
        prefix: `rt:${target.name}:`,
        timeoutMs: 10_000,
      });
(async () => {
  const counts = [];
  for (let i = 0; i < 10; i++) counts.push((await store.hit(key, 60_000, 1)).count);
  parentPort.postMessage(counts);
})();
