'use strict';
// memoryStore: the JS face of the native table. The hit stays synchronous in
// Rust and hands back an already settled promise: no thread hop per hit.

const native = require('./native.js');
const { invalidHit, checkOptions, checkWellFormed, checkPositiveInteger, notAnswered } = require('./check.js');

const DEFAULT_MAX_KEYS = 1_000_000;
const OPTIONS = ['maxKeys', 'name'];

class MemoryStore {
  #hit;
  #size;
  /** The table's numbers, in memory the addon owns: [windowMs, amount] in, resetMs out in [0]. */
  #io;

  constructor(options) {
    const { maxKeys = DEFAULT_MAX_KEYS, name } = checkOptions('memoryStore', options, OPTIONS);
    checkPositiveInteger('memoryStore', 'maxKeys', maxKeys);
    checkWellFormed('memoryStore', 'name', name);
    const table = native.memoryStore(maxKeys, name);
    this.#hit = table.hit;
    this.#size = table.size;
    this.#io = table.io;
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
    const io = this.#io;
    io[0] = windowMs;
    io[1] = amount;
    let count;
    try {
      count = this.#hit(key);
    } catch (error) {
      return Promise.reject(error);
    }
    // A number is the only success: undefined means the hit failed and its error could not be thrown.
    if (count === undefined) return Promise.reject(notAnswered());
    return Promise.resolve({ count, resetMs: io[0] });
  }
}

function memoryStore(options) {
  return new MemoryStore(options);
}

module.exports = { memoryStore, MemoryStore };
