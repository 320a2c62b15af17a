'use strict';
// mysqlStore: the JS face of the native MySQL / MariaDB store. A call is checked here and queued to the
// native I/O thread by a synchronous call; its promise is settled when its batch of results comes back,
// as postgresStore's are (lib/in-flight.js).

const native = require('./native.js');
const {
  checkOptions,
  checkOption,
  checkWellFormed,
  checkPositiveInteger,
  rangeError,
  rejection,
} = require('./check.js');
const { ServerOperations, WATCHERS, TAKES, checkTakes, toldStep } = require('./ops.js');
const { InFlight, sendStep } = require('./in-flight.js');
const { told } = require('./watch.js');
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

class MysqlStore extends ServerOperations {
  #native;
  #failures;
  /** The calls in flight, their promises and the settling of each batch of results. */
  #inFlight;
  #opened = false;
  #calls = 0;

  constructor(options) {
    super();
    const { url, table, timeoutMs, createTable, sslMode, tls, sweepIntervalMs, connections, onError } = checkOptions(
      'mysqlStore',
      options,
      OPTIONS,
    );
    this.#failures = new Failures('mysqlStore', onError);
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
    this.#inFlight = new InFlight(this.#failures);
    const store = new native.MysqlNative(
      this.#inFlight.settle,
      url,
      table,
      timeoutMs,
      createTable,
      sslMode,
      ca,
      sweepIntervalMs,
      connections,
    );
    this.#native = store;
    this.#inFlight.attach(store.results(), (held) => store.hold(held));
  }

  stats() {
    return {
      kind: 'mysql',
      calls: this.#calls,
      errors: this.#failures.snapshot(),
      inFlight: this.#inFlight.count,
      swept: this.#native.swept(),
    };
  }

  /** Reads the environment, on the first call, never at import or construction. */
  #open() {
    if (!this.#opened) {
      this.#opened = true;
      this.#native.open(process.env);
    }
  }

  /** Deletes every counter of the store's tables. */
  resetAll() {
    return this[WATCHERS] !== undefined ? told(this, 'all', '', undefined, () => this.#resetAll()) : this.#resetAll();
  }

  #resetAll() {
    let pending;
    try {
      this.#open();
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
      this.#open();
      this.#native.call(slot, op, key, a, b, c, d);
    } catch (error) {
      inFlight.free(slot);
      return rejection(this.#failures.failed(error));
    }
    return inFlight.track(slot, op);
  }

  /**
   * Several takes as one step (see ops.js's TAKES): made all, or none, in one transaction of their
   * own, their rows locked by table, then key.
   */
  [TAKES](takes) {
    const error = checkTakes(takes);
    if (error) return rejection(error);
    return toldStep(this, takes, () => {
      this.#calls += takes.length;
      const send = (numbers, keys) => {
        this.#open();
        this.#native.takes(numbers, keys);
      };
      return sendStep(this.#inFlight, this.#failures, send, takes);
    });
  }

  /** Refuses later calls (ERR_CLOSED) and ends the connections; resolves once the calls in flight have settled. */
  close() {
    this.#native.close();
    return this.#inFlight.drained();
  }
}

function mysqlStore(options) {
  return new MysqlStore(options);
}

module.exports = { mysqlStore, MysqlStore };
