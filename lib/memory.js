'use strict';
// memoryStore: the JS face of the native table. The hit stays synchronous in
// Rust and hands back an already settled promise: no thread hop per hit.

const native = require('./native.js');
const { invalidHit, checkOptions, checkOption, checkPositiveInteger } = require('./check.js');

const DEFAULT_MAX_KEYS = 1_000_000;
const OPTIONS = ['maxKeys', 'name'];
// [windowMs, amount] in, [count, resetMs] out: numbers cross without JS values.
const io = native.hitIO;

class MemoryStore {
  #hit;
  #size;

  constructor(options) {
    const { maxKeys = DEFAULT_MAX_KEYS, name } = checkOptions('memoryStore', options, OPTIONS);
    checkPositiveInteger('memoryStore', 'maxKeys', maxKeys);
    checkOption('memoryStore', 'name', name, 'string');
    const table = native.memoryStore(maxKeys, name);
    this.#hit = table.hit;
    this.#size = table.size;
  }

  /** Always false: the counters live in this process. */
  get shared() {
    return false;
  }

  /** Counters held now, including ended windows not yet swept. */
  get size() {
    return this.#size();
  }

  hit(key, windowMs, amount) {
    const invalid = invalidHit(key, windowMs, amount);
    if (invalid !== undefined) return Promise.reject(invalid);
    io[0] = windowMs;
    io[1] = amount;
    try {
      this.#hit(key);
    } catch (error) {
      return Promise.reject(error);
    }
    return Promise.resolve({ count: io[0], resetMs: io[1] });
  }
}

function memoryStore(options) {
  return new MemoryStore(options);
}

module.exports = { memoryStore, MemoryStore };
