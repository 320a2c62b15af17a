'use strict';
// memoryStore: the JS face of the native table. The hit stays synchronous in
// Rust and hands back an already settled promise: no thread hop per hit.

const native = require('./native.js');
const {
  invalidHit,
  checkOptions,
  checkWellFormed,
  checkPositiveInteger,
  notAnswered,
  closedError,
  rejection,
  storeFull,
} = require('./check.js');
const { Failures } = require('./stats.js');

const { Operations, decode, WATCHERS, TAKES, RESET_ALL, checkTakes, toldStep } = require('./ops.js');
const { told } = require('./watch.js');

const DEFAULT_MAX_KEYS = 1_000_000;
const OPTIONS = ['maxKeys', 'name', 'onError'];

class MemoryStore extends Operations {
  #hit;
  #call;
  #size;
  #clear;
  #stats;
  #close;
  #takes;
  #takesIo;
  #closed = false;
  #failures;
  /** The message of ERR_STORE_FULL, as the addon words it. */
  #fullMessage;
  /**
   * The table's numbers, in memory the addon owns: a hit's [windowMs, amount] in and [resetMs, count]
   * out; an op's [op, a, b, c, d] in and its answer out.
   */
  #io;

  constructor(options) {
    super();
    const { maxKeys = DEFAULT_MAX_KEYS, name, onError } = checkOptions('memoryStore', options, OPTIONS);
    checkPositiveInteger('memoryStore', 'maxKeys', maxKeys);
    checkWellFormed('memoryStore', 'name', name);
    this.#failures = new Failures('memoryStore', onError);
    const table = native.memoryStore(maxKeys, name);
    this.#hit = table.hit;
    this.#call = table.call;
    this.#size = table.size;
    this.#clear = table.clear;
    this.#stats = table.stats;
    this.#close = table.close;
    this.#io = table.io;
    this.#takes = table.takes;
    this.#takesIo = table.takesIo;
    this.#fullMessage = table.fullMessage;
  }

  /**
   * The table's figures (for a named store, every holder's) and this store's failed calls, by code.
   * Sums 80 shards' counts under their locks: cheap enough for every scrape.
   */
  stats() {
    const [held, capacity, calls, ended, short, sweeps, swept] = this.#stats();
    const errors = this.#failures.snapshot();
    return {
      kind: /** @type {const} */ ('memory'),
      calls,
      errors,
      refusals: errors.ERR_STORE_FULL ?? 0,
      held,
      capacity,
      evictions: { ended, short },
      sweeps,
      swept,
    };
  }

  /** Refuses later calls (ERR_CLOSED); frees the table, or for a named store once its last holder closes. */
  close() {
    if (!this.#closed) {
      this.#closed = true;
      try {
        this.#close();
      } catch (error) {
        return rejection(error);
      }
    }
    return Promise.resolve();
  }

  /** A failed call's rejection: counted, and told to onError. */
  #fail(error) {
    return rejection(this.#failures.failed(error));
  }

  /**
   * Always false: the counters live in this process.
   * @returns {false}
   */
  get shared() {
    return false;
  }

  /** Counters held now, including ended windows not yet swept. */
  get size() {
    return this.#size();
  }

  hit(key, windowMs, amount) {
    const invalid = invalidHit(key, windowMs, amount);
    if (invalid !== undefined) return rejection(invalid);
    if (amount < 0 && this[WATCHERS] !== undefined) {
      return told(this, 'fixed', key, undefined, () => this.#hitChecked(key, windowMs, amount));
    }
    return this.#hitChecked(key, windowMs, amount);
  }

  /** A hit whose arguments were checked. */
  #hitChecked(key, windowMs, amount) {
    if (this.#closed) return this.#fail(closedError('memoryStore'));
    const io = this.#io;
    io[0] = windowMs;
    io[1] = amount;
    try {
      this.#hit(key);
    } catch (error) {
      return this.#fail(error);
    }
    // A resetMs (never negative) is the only success: the hit took its inputs, leaving NaN. -1 is a
    // refusal of a full store; NaN means the hit failed and its error could not be thrown.
    const resetMs = io[0];
    if (resetMs >= 0) return Promise.resolve({ count: io[1], resetMs });
    return this.#fail(resetMs === -1 ? storeFull(this.#fullMessage) : notAnswered());
  }

  /** Runs one op (its arguments already checked) on the table, at once, and answers a settled promise. */
  _call(op, key, a, b, c, d) {
    if (this.#closed) return this.#fail(closedError('memoryStore'));
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
      return this.#fail(error);
    }
    if (n === undefined) return this.#fail(notAnswered());
    return Promise.resolve(decode(op, io, 0));
  }

  /**
   * Several takes as one step, under every shard lock they need at once (see ops.js's TAKES): made all,
   * or none. A sliding window or bucket take is told to the block caches watching this store, as its
   * own call would be.
   */
  [TAKES](takes) {
    const error = checkTakes(takes);
    if (error) return rejection(error);
    return toldStep(this, takes, () => this.#takesChecked(takes));
  }

  #takesChecked(takes) {
    if (this.#closed) return this.#fail(closedError('memoryStore'));
    const io = this.#takesIo;
    io[0] = takes.length;
    let keys = '';
    takes.forEach((take, i) => {
      const at = 1 + 6 * i;
      io[at] = take.op;
      io[at + 1] = take.a;
      io[at + 2] = take.b;
      io[at + 3] = take.c;
      io[at + 4] = take.d;
      io[at + 5] = take.key.length;
      keys += take.key;
    });
    let n;
    try {
      n = this.#takes(keys);
    } catch (error) {
      return this.#fail(error);
    }
    if (n !== takes.length) return this.#fail(notAnswered());
    const answers = takes.map((take, i) => decode(take.op, io, 1 + 6 * i));
    return Promise.resolve({ allowed: io[0] === 1, answers });
  }

  /** Drops every counter, at once (resetAll(), lib/ops.js). */
  [RESET_ALL]() {
    if (this.#closed) return this.#fail(closedError('memoryStore'));
    try {
      this.#clear();
    } catch (error) {
      return this.#fail(error);
    }
    return Promise.resolve();
  }
}

function memoryStore(options) {
  return new MemoryStore(options);
}

module.exports = { memoryStore, MemoryStore };
