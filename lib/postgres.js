'use strict';
// postgresStore: the JS face of the native PostgreSQL store. A call is checked here and queued to the
// native I/O thread by a synchronous call; its promise is settled when its batch of results comes
// back, as redisStore's are (lib/in-flight.js).

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

const OPTIONS = ['url', 'table', 'schema', 'timeoutMs', 'createTable', 'sslmode', 'tls', 'sweepIntervalMs', 'onError'];
/** The longest sweep interval: what a native u32 of ms holds (about 49 days). */
const MAX_SWEEP_MS = 2 ** 32 - 1;
/** The longest timeoutMs, as the native u32 holds it (about 49 days). */
const MAX_TIMEOUT_MS = 2 ** 32 - 1;
const SSLMODES = ['disable', 'prefer', 'require', 'verify-ca', 'verify-full'];

class PostgresStore extends ServerOperations {
  #native;
  #failures;
  /** The calls in flight, their promises and the settling of each batch of results. */
  #inFlight;
  #opened = false;
  #calls = 0;

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
    this.#inFlight = new InFlight(this.#failures);
    const store = new native.PostgresNative(
      this.#inFlight.settle,
      url,
      table,
      schema,
      timeoutMs,
      createTable,
      sslmode,
      ca,
      sweepIntervalMs,
    );
    this.#native = store;
    this.#inFlight.attach(store.results(), (held) => store.hold(held));
  }

  stats() {
    return {
      kind: 'postgres',
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

  /** Deletes every counter of the table. */
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
   * own, their rows locked by table, then key, as a batch's are.
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

  /** Refuses later calls (ERR_CLOSED) and ends the connection; resolves once the calls in flight have settled. */
  close() {
    this.#native.close();
    return this.#inFlight.drained();
  }
}

function postgresStore(options) {
  return new PostgresStore(options);
}

module.exports = { postgresStore, PostgresStore };
