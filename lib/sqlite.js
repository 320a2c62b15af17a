'use strict';
// sqliteStore: the JS face of the native SQLite store. A call is checked here and queued to the
// store's own native thread by a synchronous call; its promise is settled when its batch of results
// comes back, as postgresStore's are (lib/in-flight.js).

const { resolve } = require('node:path');
const native = require('./native.js');
const { checkOptions, checkOption, checkPositiveInteger, rangeError, rejection } = require('./check.js');
const { ServerOperations, WATCHERS, TAKES, checkTakes, toldStep } = require('./ops.js');
const { InFlight, sendStep } = require('./in-flight.js');
const { told } = require('./watch.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['path', 'timeoutMs', 'synchronous', 'sweepIntervalMs', 'onError'];
/** The file a store opens when no `path` is given, in the working directory at construction. */
const DEFAULT_PATH = 'ratestore.sqlite3';
/** The longest sweep interval and timeout: what a native u32 of ms holds (about 49 days). */
const MAX_MS = 2 ** 32 - 1;
const SYNCHRONOUS = ['normal', 'full'];

class SqliteStore extends ServerOperations {
  #native;
  #failures;
  /** The calls in flight, their promises and the settling of each batch of results. */
  #inFlight;
  #calls = 0;
  #shared;

  constructor(options) {
    super();
    const { path, timeoutMs, synchronous, sweepIntervalMs, onError } = checkOptions('sqliteStore', options, OPTIONS);
    this.#failures = new Failures('sqliteStore', onError);
    checkOption('sqliteStore', 'path', path, 'string');
    if (path !== undefined && (path.length === 0 || path.includes('\0'))) {
      throw rangeError("sqliteStore(options): path must name a file (or be ':memory:'), without NUL characters");
    }
    checkOption('sqliteStore', 'synchronous', synchronous, 'string');
    if (synchronous !== undefined && !SYNCHRONOUS.includes(synchronous)) {
      throw rangeError(
        `sqliteStore(options): synchronous must be one of ${SYNCHRONOUS.join(', ')}, got ${JSON.stringify(synchronous)}`,
      );
    }
    if (timeoutMs !== undefined) {
      checkPositiveInteger('sqliteStore', 'timeoutMs', timeoutMs);
      if (timeoutMs > MAX_MS) throw rangeError(`sqliteStore(options): timeoutMs must be at most ${MAX_MS}`);
    }
    checkOption('sqliteStore', 'sweepIntervalMs', sweepIntervalMs, 'number');
    if (
      sweepIntervalMs !== undefined &&
      !(Number.isInteger(sweepIntervalMs) && sweepIntervalMs >= 0 && sweepIntervalMs <= MAX_MS)
    ) {
      throw rangeError(
        `sqliteStore(options): sweepIntervalMs must be an integer from 0 (no sweeping) to ${MAX_MS}, got ${sweepIntervalMs}`,
      );
    }
    // A relative path is the working directory's at construction, whatever chdir() comes later.
    const file = path === ':memory:' ? path : resolve(path ?? DEFAULT_PATH);
    this.#shared = file !== ':memory:';
    this.#inFlight = new InFlight(this.#failures);
    const store = new native.SqliteNative(this.#inFlight.settle, file, timeoutMs, synchronous, sweepIntervalMs);
    this.#native = store;
    this.#inFlight.attach(store.results(), (held) => store.hold(held));
  }

  /**
   * True: every process of this host that opens the same file sees the same counters (no other host
   * does). False for ':memory:', whose counters are this store's alone.
   */
  get shared() {
    return this.#shared;
  }

  stats() {
    const [swept, commits, busyWaits] = this.#native.counts();
    return {
      kind: 'sqlite',
      calls: this.#calls,
      errors: this.#failures.snapshot(),
      inFlight: this.#inFlight.count,
      commits,
      busyWaits,
      swept,
    };
  }

  /** Deletes every counter of the file. */
  resetAll() {
    return this[WATCHERS] !== undefined ? told(this, 'all', '', undefined, () => this.#resetAll()) : this.#resetAll();
  }

  #resetAll() {
    let pending;
    try {
      pending = this.#native.resetAll();
    } catch (error) {
      return rejection(this.#failures.failed(error));
    }
    // It settles through its own promise, with an Error to reject with.
    return this.#inFlight.follow(pending).then((value) => {
      if (value instanceof Error) throw this.#failures.failed(value);
      return undefined;
    });
  }

  _call(op, key, a, b, c, d) {
    const inFlight = this.#inFlight;
    this.#calls++;
    const slot = inFlight.slot();
    try {
      this.#native.call(slot, op, key, a, b, c, d);
    } catch (error) {
      inFlight.free(slot);
      return rejection(this.#failures.failed(error));
    }
    return inFlight.track(slot, op);
  }

  /**
   * Several takes as one step (see ops.js's TAKES): made all, or none, in one transaction of the
   * store's thread, each computed on its row as read inside it.
   */
  [TAKES](takes) {
    const error = checkTakes(takes);
    if (error) return rejection(error);
    return toldStep(this, takes, () => {
      this.#calls += takes.length;
      return sendStep(this.#inFlight, this.#failures, (numbers, keys) => this.#native.takes(numbers, keys), takes);
    });
  }

  /** Refuses later calls (ERR_CLOSED) and closes the file; resolves once the calls in flight have settled. */
  close() {
    this.#native.close();
    return this.#inFlight.drained();
  }
}

function sqliteStore(options) {
  return new SqliteStore(options);
}

module.exports = { sqliteStore, SqliteStore, DEFAULT_PATH };
