'use strict';

const { memoryStore } = require('./lib/memory.js');
const { redisStore } = require('./lib/redis.js');
const { createLimiter } = require('./lib/limiter.js');
const { clientIp } = require('./lib/client-ip.js');
const { universalStore, expressStore } = require('./lib/adapters.js');

module.exports = { memoryStore, redisStore, createLimiter, clientIp, universalStore, expressStore };
