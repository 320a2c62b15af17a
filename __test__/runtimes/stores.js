'use strict';
// The store a target of RATESTORE_TARGETS names, as checks.js, worker.js and idle.js make it: memory,
// redisStore over one transport, postgresStore or mysqlStore (one table for the whole suite; every key
// holds the run's id), or sqliteStore (one file for the whole suite).
const { readFileSync } = require('node:fs');
const { memoryStore, redisStore, postgresStore, mysqlStore, sqliteStore } = require('../..');

/** `part` keeps one use's keys apart from another's (a Redis prefix); memory stores take `name`. */
function storeFor(target, part = '', name = undefined) {
  if (target.name === 'memory') return memoryStore(name === undefined ? undefined : { name });
  if (target.postgres) return postgresStore({ url: target.url, table: 'rt_counters', timeoutMs: 10_000 });
  if (target.mysql) return mysqlStore({ url: target.url, table: 'rt_counters', timeoutMs: 10_000 });
  if (target.sqlite) return sqliteStore({ path: target.url, timeoutMs: 10_000 });
  return redisStore({
    url: target.url,
    token: target.token,
    cluster: target.cluster,
    tls: target.ca ? { ca: readFileSync(target.ca, 'utf8') } : undefined,
    prefix: `rt:${target.name}:${part}`,
    timeoutMs: 10_000,
  });
}

module.exports = { storeFor };
