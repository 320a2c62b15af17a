'use strict';
// Uses a store, then leaves it open and idle: the process must exit by itself.
const { storeFor } = require('./stores.js');

const target = JSON.parse(process.env.RATESTORE_TARGET);
const store = storeFor(target, 'idle:');
(async () => {
  for (let i = 0; i < 20; i++) await store.hit(`k${i % 3}`, 60_000, 1);
  console.log('done');
})();
