'use strict';
// postgresStore: the JS face of the native PostgreSQL store. A call is checked here and queued to the
// native I/O thread by a synchronous call; its promise is settled when its batch of results comes
// back, as redisStore's are (lib/in-flight.js).

const native = require('./native.js');
const { checkOptions, checkOption, checkWellFormed, checkPositiveInteger, rangeError } = require('./check.js');
const { ThreadedStore } = require('./threaded.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['url', 'table', 'schema', 'timeoutMs', 'createTable', 'sslmode', 'tls', 'sweepIntervalMs', 'onError'];
/** The longest sweep interval: what a native u32 of ms holds (about 49 days). */
const MAX_SWEEP_MS = 2 ** 32 - 1;
/** The longest timeoutMs, as the native u32 holds it (about 49 days). */
const MAX_TIMEOUT_MS = 2 ** 32 - 1;
const SSLMODES = ['disable', 'prefer', 'require', 'verify-ca', 'verify-full'];

class PostgresStore extends ThreadedStore {
  /**
   * Always true: every instance that uses the same server sees the same counters.
   * @returns {true}
   */
  get shared() {
    return true;
  }

  constructor(options) {
    const { url, table, schema, timeoutMs, createTable, sslmode, tls, sweepIntervalMs, onError } = checkOptions(
      'postgresStore',
      options,
      OPTIONS,
    );
    const failures = new Failures('postgresStore', onError);
    checkOption('postgresStore', 'url', url, 'string');
    checkWellFormed('postgresStore', 'table', table);
    checkWellFormed('postgresStore', 'schema', schema);
    checkOption('postgresStore', 'createTable', createTable, 'boolean');
    checkOption('postgresStore', 'sslmode', sslmode, 'string');
    if (sslmode !== undefined && !SSLMODES.includes(sslmode)) {
      throw rangeError(
        `postgresStore(options): sslmode must be one of ${SSLMODES.join(', ')}, got ${JSON.stringify(sslmode)}`,
      );
    }
    const { ca } = checkOptions('postgresStore', tls, ['ca'], 'tls');
    checkOption('postgresStore', 'tls.ca', ca, 'string');
    if (timeoutMs !== undefined) {
      checkPositiveInteger('postgresStore', 'timeoutMs', timeoutMs);
      // The native side holds a u32 of ms: a larger one would wrap.
      if (timeoutMs > MAX_TIMEOUT_MS) {
        throw rangeError(`postgresStore(options): timeoutMs must be at most ${MAX_TIMEOUT_MS}, got ${timeoutMs}`);
      }
    }
    checkOption('postgresStore', 'sweepIntervalMs', sweepIntervalMs, 'number');
    if (
      sweepIntervalMs !== undefined &&
      !(Number.isInteger(sweepIntervalMs) && sweepIntervalMs >= 0 && sweepIntervalMs <= MAX_SWEEP_MS)
    ) {
      throw rangeError(
        `postgresStore(options): sweepIntervalMs must be an integer from 0 (no sweeping) to ${MAX_SWEEP_MS}, got ${sweepIntervalMs}`,
      );
    }
    super({
      kind: /** @type {const} */ ('postgres'),
      failures,
      make: (settle) =>
        new native.PostgresNative(settle, url, table, schema, timeoutMs, createTable, sslmode, ca, sweepIntervalMs),
      // Reads the environment, on the first call, never at import or construction.
      opens: true,
      figures: (store) => ({ swept: store.swept() }),
      gather: true,
    });
  }

  // resetAll() deletes every counter of the table; a step's takes (store[TAKES]) are made all, or none,
  // in one transaction of their own, their rows locked by table, then key, as a batch's are; close()
  // ends the connection (lib/threaded.js).
}

function postgresStore(options) {
  return new PostgresStore(options);
}

module.exports = { postgresStore, PostgresStore };
