'use strict';

const { memoryStore } = require('./lib/memory.js');

module.exports = { memoryStore };
