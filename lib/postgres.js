'use strict';
// postgresStore: the JS face of the native PostgreSQL store. A call is checked here and run on the
// native I/O thread; its promise resolves with the op's numbers, or with the error it rejects with.

const native = require('./native.js');
const {
  checkOptions,
  checkOption,
  checkWellFormed,
  checkPositiveInteger,
  rangeError,
  rejection,
} = require('./check.js');
const { ServerOperations, decode, WATCHERS } = require('./ops.js');
const { told } = require('./watch.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['url', 'table', 'schema', 'timeoutMs', 'createTable', 'sslmode', 'tls', 'sweepIntervalMs', 'onError'];
/** The longest sweep interval: what a native u32 of ms holds (about 49 days). */
const MAX_SWEEP_MS = 2 ** 32 - 1;
const SSLMODES = ['disable', 'prefer', 'require', 'verify-ca', 'verify-full'];

class PostgresStore extends ServerOperations {
  #native;
  #failures;
  #opened = false;
  #calls = 0;
  #inFlight = 0;
  /** close() promises waiting for the calls in flight. */
  #drained = [];

  constructor(options) {
    super();
    const { url, table, schema, timeoutMs, createTable, sslmode, tls, sweepIntervalMs, onError } = checkOptions(
      'postgresStore',
      options,
      OPTIONS,
    );
    this.#failures = new Failures('postgresStore', onError);
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
    if (timeoutMs !== undefined) checkPositiveInteger('postgresStore', 'timeoutMs', timeoutMs);
    checkOption('postgresStore', 'sweepIntervalMs', sweepIntervalMs, 'number');
    if (
      sweepIntervalMs !== undefined &&
      !(Number.isInteger(sweepIntervalMs) && sweepIntervalMs >= 0 && sweepIntervalMs <= MAX_SWEEP_MS)
    ) {
      throw rangeError(
        `postgresStore(options): sweepIntervalMs must be an integer from 0 (no sweeping) to ${MAX_SWEEP_MS}, got ${sweepIntervalMs}`,
      );
    }
    this.#native = new native.PostgresNative(url, table, schema, timeoutMs, createTable, sslmode, ca, sweepIntervalMs);
  }

  stats() {
    return {
      kind: 'postgres',
      calls: this.#calls,
      errors: this.#failures.snapshot(),
      inFlight: this.#inFlight,
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

  /** Deletes every counter of the table. */
  resetAll() {
    const reset = () => this.#track(() => this.#native.resetAll()).then(() => undefined);
    return this[WATCHERS] !== undefined ? told(this, 'all', '', undefined, reset) : reset();
  }

  _call(op, key, a, b, c, d) {
    this.#calls++;
    return this.#track(() => this.#native.call(op, key, a, b, c, d)).then((v) => decode(op, v, 0));
  }

  /** Runs a native call: its promise resolves with numbers or an Error, which becomes the rejection. */
  #track(start) {
    let pending;
    try {
      this.#open();
      pending = start();
    } catch (error) {
      return rejection(this.#failures.failed(error));
    }
    this.#inFlight++;
    return pending.then((value) => {
      this.#inFlight--;
      if (this.#inFlight === 0 && this.#drained.length > 0) for (const resolve of this.#drained.splice(0)) resolve();
      if (value instanceof Error) throw this.#failures.failed(value);
      return value;
    });
  }

  /** Refuses later calls (ERR_CLOSED) and ends the connection; resolves once the calls in flight have settled. */
  close() {
    this.#native.close();
    if (this.#inFlight === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }
}

function postgresStore(options) {
  return new PostgresStore(options);
}

module.exports = { postgresStore, PostgresStore };
