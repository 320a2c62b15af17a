'use strict';
// memoryStore: the JS face of the native table. The hit stays synchronous in
// Rust and hands back an already settled promise: no thread hop per hit.

const native = require('./native.js');
const { invalidHit, checkOptions, checkWellFormed, checkPositiveInteger, notAnswered } = require('./check.js');

const { Operations, decode } = require('./ops.js');

const DEFAULT_MAX_KEYS = 1_000_000;
const OPTIONS = ['maxKeys', 'name'];

class MemoryStore extends Operations {
  #hit;
  #call;
  #size;
  #clear;
  /**
   * The table's numbers, in memory the addon owns: a hit's [windowMs, amount] in and resetMs out in
   * [0]; an op's [op, a, b, c, d] in and its answer out.
   */
  #io;

  constructor(options) {
    super();
    const { maxKeys = DEFAULT_MAX_KEYS, name } = checkOptions('memoryStore', options, OPTIONS);
    checkPositiveInteger('memoryStore', 'maxKeys', maxKeys);
    checkWellFormed('memoryStore', 'name', name);
    const table = native.memoryStore(maxKeys, name);
    this.#hit = table.hit;
    this.#call = table.call;
    this.#size = table.size;
    this.#clear = table.clear;
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

  /** Runs one op (its arguments already checked) on the table, at once, and answers a settled promise. */
  _call(op, key, a, b, c, d) {
    const io = this.#io;
    io[0] = op;
    io[1] = a;
    io[2] = b;
    io[3] = c;
    io[4] = d;
    let n;
    try {
      n = this.#call(key);
    } catch (error) {
      return Promise.reject(error);
    }
    if (n === undefined) return Promise.reject(notAnswered());
    return Promise.resolve(decode(op, io, 0));
  }

  /** Drops every counter, at once. */
  resetAll() {
    try {
      this.#clear();
    } catch (error) {
      return Promise.reject(error);
    }
    return Promise.resolve();
  }
}

function memoryStore(options) {
  return new MemoryStore(options);
}

module.exports = { memoryStore, MemoryStore };
