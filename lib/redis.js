'use strict';
// redisStore: the JS face of the native Redis store. A hit is checked here,
// queued to the native I/O thread by a synchronous call, and its promise is
// settled when its batch of results comes back (see "How a hit travels" in the README).

const native = require('./native.js');
const { runtime } = require('./runtime.js');
const {
  checkOptions,
  checkOption,
  checkWellFormed,
  checkPositiveInteger,
  notAnswered,
  rangeError,
  rejection,
} = require('./check.js');

const { ServerOperations, RESET_ALL, TAKES, OP, checkTakes, toldStep } = require('./ops.js');
const { InFlight } = require('./in-flight.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['url', 'token', 'prefix', 'timeoutMs', 'tls', 'cluster', 'waitForReplicas', 'onError'];
/** The most replicas waitForReplicas may ask for. */
const MAX_WAIT_REPLICAS = 1000;

/**
 * redisStore's own entries of stats(): its connections' figures (shared by the stores that share the
 * connections: those of this thread with the same settings, or of the process for a cluster and over
 * REST), latencies one sample per answered call, from an HDR-style histogram.
 */
function figures(native) {
  const [
    connects,
    reconnects,
    connectFailures,
    losses,
    timeouts,
    noscript,
    redirections,
    unconfirmed,
    count,
    sumUs,
    p50,
    p90,
    p99,
    max,
  ] = native.stats();
  return {
    connects,
    reconnects,
    connectFailures,
    connectionLosses: losses,
    timeouts,
    noscriptReloads: noscript,
    redirections,
    unconfirmed,
    latencyMs: { count, sumMs: sumUs / 1000, p50: p50 / 1000, p90: p90 / 1000, p99: p99 / 1000, max: max / 1000 },
  };
}

class RedisStore extends ServerOperations {
  #native;
  /** The calls in flight, their promises and the settling of each batch of results. */
  #inFlight;
  #failures;
  /** Reads the environment, on the first call, never at import or construction. */
  #open;
  /** A flush of the hits sent this tick is queued. */
  #flushing = false;
  /** Writes the hits sent this tick at once: one write per tick, not one per hit. */
  #flush = () => {
    this.#flushing = false;
    this.#native.flush();
  };
  /**
   * While a resetAll() waits for the calls before it or runs: the calls (and resetAll()s) made
   * meanwhile, in order, sent once it is done, so that it takes effect between them. Else null.
   */
  #behindReset = null;

  /**
   * Always true: every instance that uses the same server sees the same counters.
   * @returns {true}
   */
  get shared() {
    return true;
  }

  constructor(options) {
    super();
    const { url, token, prefix, timeoutMs, tls, cluster, waitForReplicas, onError } = checkOptions(
      'redisStore',
      options,
      OPTIONS,
    );
    this.#failures = new Failures('redisStore', onError);
    checkOption('redisStore', 'url', url, 'string');
    checkOption('redisStore', 'token', token, 'string');
    checkWellFormed('redisStore', 'prefix', prefix);
    checkOption('redisStore', 'cluster', cluster, 'boolean');
    const { ca } = checkOptions('redisStore', tls, ['ca'], 'tls');
    checkOption('redisStore', 'tls.ca', ca, 'string');
    if (timeoutMs !== undefined) checkPositiveInteger('redisStore', 'timeoutMs', timeoutMs);
    if (waitForReplicas !== undefined) {
      checkOption('redisStore', 'waitForReplicas', waitForReplicas, 'number');
      if (!(Number.isInteger(waitForReplicas) && waitForReplicas >= 0 && waitForReplicas <= MAX_WAIT_REPLICAS)) {
        throw rangeError(
          `redisStore(options): waitForReplicas must be an integer from 0 to ${MAX_WAIT_REPLICAS}, got ${waitForReplicas}`,
        );
      }
    }
    this.#inFlight = new InFlight(this.#failures);
    const store = native.redisStore(
      url,
      token,
      prefix,
      timeoutMs,
      ca,
      cluster,
      waitForReplicas,
      this.#inFlight.settle,
      runtime.eventLoop,
    );
    this.#native = store;
    this.#open = this._serve({
      kind: /** @type {const} */ ('redis'),
      native: store,
      failures: this.#failures,
      inFlight: this.#inFlight,
      figures,
    });
    this.#inFlight.attach(store.results, (held) => (held ? store.ref() : store.unref()));
  }

  /**
   * Unlinks every key under the prefix (SCAN and UNLINK in batches, on every master of a cluster),
   * in order with this store's calls: it starts once the calls made before it have settled, and
   * the calls made after it are sent once it is done (resetAll(), lib/ops.js).
   */
  [RESET_ALL]() {
    if (this.#behindReset !== null) return this.#wait(null);
    this.#behindReset = [];
    const reset = () => {
      let done;
      try {
        this.#open();
        done = this.#native.resetAll();
      } catch (error) {
        done = Promise.reject(error);
      }
      return done.then(
        () => this.#resume(),
        (error) => {
          this.#resume();
          throw this.#failures.failed(error);
        },
      );
    };
    return this.#inFlight.count === 0 ? reset() : this.#inFlight.drained().then(reset);
  }

  /** A call (`args` null: a resetAll; a function: a step) made while a resetAll is under way: made once it is done. */
  #wait(args) {
    return new Promise((resolve, reject) => this.#behindReset.push({ args, resolve, reject }));
  }

  /** The resetAll is done: the calls made meanwhile go, in order (a later resetAll waits again). */
  #resume() {
    const waiting = this.#behindReset;
    this.#behindReset = null;
    for (const { args, resolve, reject } of waiting) {
      const call = args === null ? this[RESET_ALL]() : typeof args === 'function' ? args() : this._call(...args);
      call.then(resolve, reject);
    }
  }

  /** Sends one op (its arguments already checked) and answers the promise of its result. */
  _call(op, key, a, b, c, d) {
    if (this.#behindReset !== null) return this.#wait([op, key, a, b, c, d]);
    const store = this.#native;
    const inFlight = this.#inFlight;
    this._count(1);
    const slot = inFlight.slot();
    try {
      this.#open();
      // true is the only success: undefined means it failed and its error could not be thrown.
      if (store.send(slot, op, key, a, b, c, d) !== true) throw notAnswered();
    } catch (error) {
      inFlight.free(slot);
      return rejection(this.#failures.failed(error));
    }
    if (!this.#flushing) {
      this.#flushing = true;
      queueMicrotask(this.#flush);
    }
    return inFlight.track(slot, op);
  }

  /**
   * Several takes as one step (see ops.js's TAKES): one script over every take's key, which runs each
   * take and, when one refuses, puts every key back as it found it, so no other call ever sees a take
   * made and then undone. In a Redis Cluster the keys must share a slot (a `{hash tag}` in the key);
   * else it answers null, doing nothing. A sliding window or bucket take is told to the block caches
   * watching this store, as its own call would be.
   */
  [TAKES](takes) {
    const error = checkTakes(takes);
    if (error) return rejection(error);
    return toldStep(this, takes, () => this.#takes(takes));
  }

  #takes(takes) {
    if (this.#behindReset !== null) {
      return new Promise((resolve, reject) =>
        this.#behindReset.push({ args: () => this.#takes(takes), resolve, reject }),
      );
    }
    const numbers = [];
    let keys = '';
    for (const take of takes) {
      numbers.push(take.op, take.a, take.b, take.c, take.d, take.key.length);
      keys += take.key;
    }
    const inFlight = this.#inFlight;
    this._count(1);
    const slot = inFlight.slot();
    try {
      this.#open();
      if (!this.#native.sendTakes(slot, numbers, keys)) {
        inFlight.free(slot);
        this._count(-1);
        return Promise.resolve(null);
      }
    } catch (error) {
      inFlight.free(slot);
      return rejection(this.#failures.failed(error));
    }
    if (!this.#flushing) {
      this.#flushing = true;
      queueMicrotask(this.#flush);
    }
    return inFlight.track(
      slot,
      OP.takes,
      takes.map((take) => take.op),
    );
  }
}

function redisStore(options) {
  return new RedisStore(options);
}

module.exports = { redisStore, RedisStore };
