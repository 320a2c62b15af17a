'use strict';
// Uses a store, then leaves it open and idle: the process must exit by itself.
const { readFileSync } = require('node:fs');
const { memoryStore, redisStore } = require('../..');

const target = JSON.parse(process.env.RATESTORE_TARGET);
const store =
  target.name === 'memory'
    ? memoryStore()
    : redisStore({
        url: target.url,
        token: target.token,
        cluster: target.cluster,
        tls: target.ca ? { ca: readFileSync(target.ca, 'utf8') } : undefined,
        prefix: `rt:${target.name}:idle:`,
        timeoutMs: 10_000,
      });
(async () => {
  for (let i = 0; i < 20; i++) await store.hit(`k${i % 3}`, 60_000, 1);
  console.log('done');
})();
