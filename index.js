'use strict';

const { memoryStore } = require('./lib/memory.js');
const { createLimiter } = require('./lib/limiter.js');

module.exports = { memoryStore, createLimiter };
