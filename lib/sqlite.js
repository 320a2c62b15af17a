'use strict';
// sqliteStore: the JS face of the native SQLite store. A call is checked here and made by a synchronous
// call: one made alone while the store is idle runs at once, its promise resolved on return; any other
// is queued to the store's own native thread, its promise settled when its batch of results comes back,
// as postgresStore's are (lib/threaded.js, lib/in-flight.js).

const { resolve } = require('node:path');
const native = require('./native.js');
const { checkOptions, checkOption, checkPositiveInteger, rangeError } = require('./check.js');
const { ThreadedStore } = require('./threaded.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['path', 'timeoutMs', 'synchronous', 'sweepIntervalMs', 'onError'];
/** The file a store opens when no `path` is given, in the working directory at construction. */
const DEFAULT_PATH = 'ratestore.sqlite3';
/** The longest sweep interval and timeout: what a native u32 of ms holds (about 49 days). */
const MAX_MS = 2 ** 32 - 1;
const SYNCHRONOUS = ['normal', 'full'];

class SqliteStore extends ThreadedStore {
  #shared;

  constructor(options) {
    const { path, timeoutMs, synchronous, sweepIntervalMs, onError } = checkOptions('sqliteStore', options, OPTIONS);
    const failures = new Failures('sqliteStore', onError);
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
    super({
      kind: /** @type {const} */ ('sqlite'),
      failures,
      make: (settle) => new native.SqliteNative(settle, file, timeoutMs, synchronous, sweepIntervalMs),
      opens: false,
      atOnce: true,
      figures: (store) => {
        const [swept, commits, busyWaits] = store.counts();
        return { commits, busyWaits, swept };
      },
    });
    this.#shared = file !== ':memory:';
  }

  /**
   * True: every process of this host that opens the same file sees the same counters (no other host
   * does). False for ':memory:', whose counters are this store's alone.
   */
  get shared() {
    return this.#shared;
  }

  // resetAll() deletes every counter of the file; a step's takes (store[TAKES]) are made all, or none,
  // in one transaction of the store's thread, each computed on its row as read inside it; close()
  // closes the file (lib/threaded.js).
}

function sqliteStore(options) {
  return new SqliteStore(options);
}

module.exports = { sqliteStore, SqliteStore, DEFAULT_PATH };
