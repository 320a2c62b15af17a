'use strict';
// One worker thread of checks.js: ten hits on one key, answering the counts it saw.
const { parentPort, workerData } = require('node:worker_threads');
const { storeFor } = require('./stores.js');

const { target, key } = workerData;
const store = storeFor(target, '', key);
(async () => {
  const counts = [];
  for (let i = 0; i < 10; i++) counts.push((await store.hit(key, 60_000, 1)).count);
  parentPort.postMessage(counts);
})();
