'use strict';

const { memoryStore } = require('./lib/memory.js');
const { redisStore } = require('./lib/redis.js');
const { postgresStore } = require('./lib/postgres.js');
const { sqliteStore } = require('./lib/sqlite.js');
const { mysqlStore } = require('./lib/mysql.js');
const { createLimiter } = require('./lib/limiter/index.js');
const { clientIp } = require('./lib/client-ip.js');
const { universalStore, expressStore } = require('./lib/adapters.js');
const { metricsText } = require('./lib/stats.js');
const { isRatestoreError } = require('./lib/check.js');

/** Closes any store that can be closed; resolves at once for one that cannot. */
function closeStore(store) {
  return typeof store?.close === 'function' ? Promise.resolve(store.close()) : Promise.resolve();
}

module.exports = {
  memoryStore,
  redisStore,
  postgresStore,
  sqliteStore,
  mysqlStore,
  createLimiter,
  clientIp,
  universalStore,
  expressStore,
  metricsText,
  isRatestoreError,
  closeStore,
};
