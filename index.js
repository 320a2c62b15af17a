'use strict';

const { memoryStore } = require('./lib/memory.js');
const { redisStore } = require('./lib/redis.js');
const { createLimiter } = require('./lib/limiter.js');
const { metricsText } = require('./lib/stats.js');
const { isRatestoreError } = require('./lib/check.js');

/** Closes any store that can be closed; resolves at once for one that cannot. */
function closeStore(store) {
  return typeof store?.close === 'function' ? Promise.resolve(store.close()) : Promise.resolve();
}

module.exports = { memoryStore, redisStore, createLimiter, metricsText, isRatestoreError, closeStore };
