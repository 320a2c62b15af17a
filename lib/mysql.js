'use strict';
// mysqlStore: the JS face of the native MySQL / MariaDB store. A call is checked here and queued to the
// native I/O thread by a synchronous call; its promise is settled when its batch of results comes back,
// as postgresStore's are (lib/in-flight.js).

const native = require('./native.js');
const { checkOptions, checkOption, checkWellFormed, checkPositiveInteger, rangeError } = require('./check.js');
const { ThreadedStore } = require('./threaded.js');
const { Failures } = require('./stats.js');

const OPTIONS = [
  'url',
  'table',
  'timeoutMs',
  'createTable',
  'sslMode',
  'tls',
  'sweepIntervalMs',
  'connections',
  'onError',
];
/** The longest interval or timeout: what a native u32 of ms holds (about 49 days). */
const MAX_MS = 2 ** 32 - 1;
const MAX_CONNECTIONS = 64;
const SSL_MODES = ['DISABLED', 'PREFERRED', 'REQUIRED', 'VERIFY_CA', 'VERIFY_IDENTITY'];

class MysqlStore extends ThreadedStore {
  /**
   * Always true: every instance that uses the same server sees the same counters.
   * @returns {true}
   */
  get shared() {
    return true;
  }

  constructor(options) {
    const { url, table, timeoutMs, createTable, sslMode, tls, sweepIntervalMs, connections, onError } = checkOptions(
      'mysqlStore',
      options,
      OPTIONS,
    );
    const failures = new Failures('mysqlStore', onError);
    checkOption('mysqlStore', 'url', url, 'string');
    checkWellFormed('mysqlStore', 'table', table);
    checkOption('mysqlStore', 'createTable', createTable, 'boolean');
    checkOption('mysqlStore', 'sslMode', sslMode, 'string');
    if (sslMode !== undefined && !SSL_MODES.includes(sslMode)) {
      throw rangeError(
        `mysqlStore(options): sslMode must be one of ${SSL_MODES.join(', ')}, got ${JSON.stringify(sslMode)}`,
      );
    }
    const { ca } = checkOptions('mysqlStore', tls, ['ca'], 'tls');
    checkOption('mysqlStore', 'tls.ca', ca, 'string');
    if (timeoutMs !== undefined) {
      checkPositiveInteger('mysqlStore', 'timeoutMs', timeoutMs);
      if (timeoutMs > MAX_MS)
        throw rangeError(`mysqlStore(options): timeoutMs must be at most ${MAX_MS}, got ${timeoutMs}`);
    }
    checkOption('mysqlStore', 'sweepIntervalMs', sweepIntervalMs, 'number');
    if (
      sweepIntervalMs !== undefined &&
      !(Number.isInteger(sweepIntervalMs) && sweepIntervalMs >= 0 && sweepIntervalMs <= MAX_MS)
    ) {
      throw rangeError(
        `mysqlStore(options): sweepIntervalMs must be an integer from 0 (no sweeping) to ${MAX_MS}, got ${sweepIntervalMs}`,
      );
    }
    if (connections !== undefined) {
      checkPositiveInteger('mysqlStore', 'connections', connections);
      if (connections > MAX_CONNECTIONS) {
        throw rangeError(`mysqlStore(options): connections must be at most ${MAX_CONNECTIONS}, got ${connections}`);
      }
    }
    super({
      kind: /** @type {const} */ ('mysql'),
      failures,
      make: (settle) =>
        new native.MysqlNative(settle, url, table, timeoutMs, createTable, sslMode, ca, sweepIntervalMs, connections),
      // Reads the environment, on the first call, never at import or construction.
      opens: true,
      figures: (store) => ({ swept: store.swept() }),
    });
  }

  // resetAll() deletes every counter of the store's tables; a step's takes (store[TAKES]) are made all,
  // or none, in one transaction of their own, their rows locked by table, then key; close() ends the
  // connections (lib/threaded.js).
}

function mysqlStore(options) {
  return new MysqlStore(options);
}

module.exports = { mysqlStore, MysqlStore };
