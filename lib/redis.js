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
  rejection,
} = require('./check.js');

const { OP, ServerOperations, decode, WATCHERS } = require('./ops.js');
const { told } = require('./watch.js');
const { Failures } = require('./stats.js');

const OPTIONS = ['url', 'token', 'prefix', 'timeoutMs', 'tls', 'cluster', 'onError'];
/** Numbers per result in the native `results`: the id, then the op's answer. */
const STRIDE = 7;

class RedisStore extends ServerOperations {
  #native;
  #results;
  // A hit in flight is known by a slot: the index of its promise's settle
  // functions here. Slots are reused once settled, so ids stay small.
  #resolvers = [];
  #rejecters = [];
  /** The op of each slot's call: how its answer becomes a result. */
  #ops = [];
  #freeSlots = [];
  #inFlight = 0;
  /** Calls sent (plain integers: the event loop is one thread). */
  #calls = 0;
  #failures;
  /** Whether the native side keeps the process (and `#onBatch`) alive: while hits are in flight. */
  #held = false;
  #opened = false;
  /** A flush of the hits sent this tick is queued. */
  #flushing = false;
  /** Writes the hits sent this tick at once: one write per tick, not one per hit. */
  #flush = () => {
    this.#flushing = false;
    this.#native.flush();
  };
  /** close() promises (and a resetAll()) waiting for the hits in flight. */
  #drained = [];
  /**
   * While a resetAll() waits for the calls before it or runs: the calls (and resetAll()s) made
   * meanwhile, in order, sent once it is done, so that it takes effect between them. Else null.
   */
  #behindReset = null;
  /** Called with each batch of results. The native side holds it only weakly while idle, so it lives here. */
  #onBatch = (n, errors, events) => this.#settle(n, errors, events);
  /** Lets the process go once idle; queued as a microtask, so a caller that hits again at once keeps the hold. */
  #release = () => {
    if (this.#inFlight === 0 && this.#held) {
      this.#held = false;
      this.#native.unref();
    }
  };
  // One executor for every hit's promise: it hands over the settle functions without a closure per hit.
  #resolve;
  #reject;
  #capture = (resolve, reject) => {
    this.#resolve = resolve;
    this.#reject = reject;
  };

  constructor(options) {
    super();
    const { url, token, prefix, timeoutMs, tls, cluster, onError } = checkOptions('redisStore', options, OPTIONS);
    this.#failures = new Failures('redisStore', onError);
    checkOption('redisStore', 'url', url, 'string');
    checkOption('redisStore', 'token', token, 'string');
    checkWellFormed('redisStore', 'prefix', prefix);
    checkOption('redisStore', 'cluster', cluster, 'boolean');
    const { ca } = checkOptions('redisStore', tls, ['ca'], 'tls');
    checkOption('redisStore', 'tls.ca', ca, 'string');
    if (timeoutMs !== undefined) checkPositiveInteger('redisStore', 'timeoutMs', timeoutMs);
    this.#native = native.redisStore(url, token, prefix, timeoutMs, ca, cluster, this.#onBatch, runtime.eventLoop);
    this.#results = this.#native.results;
  }

  /**
   * This store's calls and failures, and its connections' figures (shared by the stores that share the
   * connections: those of this thread with the same settings, or of the process for a cluster and over
   * REST). Latencies are in ms, one sample per answered call, from an HDR-style histogram.
   */
  stats() {
    const [
      connects,
      reconnects,
      connectFailures,
      losses,
      timeouts,
      noscript,
      redirections,
      count,
      sumUs,
      p50,
      p90,
      p99,
      max,
    ] = this.#native.stats();
    return {
      kind: 'redis',
      calls: this.#calls,
      errors: this.#failures.snapshot(),
      inFlight: this.#inFlight,
      connects,
      reconnects,
      connectFailures,
      connectionLosses: losses,
      timeouts,
      noscriptReloads: noscript,
      redirections,
      latencyMs: { count, sumMs: sumUs / 1000, p50: p50 / 1000, p90: p90 / 1000, p99: p99 / 1000, max: max / 1000 },
    };
  }

  /** Reads the environment, on the first call, never at import or construction. */
  #open() {
    if (!this.#opened) {
      this.#opened = true;
      this.#native.open(process.env);
    }
  }

  /**
   * Unlinks every key under the prefix (SCAN and UNLINK in batches, on every master of a cluster),
   * in order with this store's calls: it starts once the calls made before it have settled, and
   * the calls made after it are sent once it is done.
   */
  resetAll() {
    return this[WATCHERS] !== undefined ? told(this, 'all', '', undefined, () => this.#resetAll()) : this.#resetAll();
  }

  #resetAll() {
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
    if (this.#inFlight === 0) return reset();
    return new Promise((resolve) => this.#drained.push(resolve)).then(reset);
  }

  /** A call (`args` null: a resetAll) made while a resetAll is under way: made once it is done. */
  #wait(args) {
    return new Promise((resolve, reject) => this.#behindReset.push({ args, resolve, reject }));
  }

  /** The resetAll is done: the calls made meanwhile go, in order (a later resetAll waits again). */
  #resume() {
    const waiting = this.#behindReset;
    this.#behindReset = null;
    for (const { args, resolve, reject } of waiting) {
      (args === null ? this.#resetAll() : this._call(...args)).then(resolve, reject);
    }
  }

  /** Sends one op (its arguments already checked) and answers the promise of its result. */
  _call(op, key, a, b, c, d) {
    if (this.#behindReset !== null) return this.#wait([op, key, a, b, c, d]);
    const store = this.#native;
    this.#calls++;
    const slot = this.#freeSlots.length > 0 ? this.#freeSlots.pop() : this.#resolvers.length;
    try {
      this.#open();
      // true is the only success: undefined means it failed and its error could not be thrown.
      if (store.send(slot, op, key, a, b, c, d) !== true) throw notAnswered();
    } catch (error) {
      this.#freeSlots.push(slot);
      return rejection(this.#failures.failed(error));
    }
    this.#inFlight++;
    if (!this.#flushing) {
      this.#flushing = true;
      queueMicrotask(this.#flush);
    }
    if (!this.#held) {
      this.#held = true;
      store.ref();
    }
    const promise = new Promise(this.#capture);
    this.#resolvers[slot] = this.#resolve;
    this.#rejecters[slot] = this.#reject;
    this.#ops[slot] = op;
    return promise;
  }

  /** Refuses later hits (ERR_CLOSED) and ends the connection; resolves once the hits in flight have settled. */
  close() {
    this.#native.close();
    if (this.#inFlight === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }

  /** Takes the settle function of a slot and frees the slot. */
  #take(settlers, slot) {
    const settle = settlers[slot];
    this.#resolvers[slot] = this.#rejecters[slot] = undefined;
    this.#freeSlots.push(slot);
    this.#inFlight--;
    return settle;
  }

  #settle(n, errors, events) {
    const results = this.#results;
    for (let i = 0; i < STRIDE * n; i += STRIDE) {
      const slot = results[i];
      const op = this.#ops[slot];
      const result = op === OP.hit ? { count: results[i + 1], resetMs: results[i + 2] } : decode(op, results, i + 1);
      this.#take(this.#resolvers, slot)(result);
    }
    if (errors !== undefined) {
      for (let i = 0; i < errors.length; i += 2) {
        this.#take(this.#rejecters, errors[i])(this.#failures.failed(errors[i + 1]));
      }
    }
    if (events !== undefined) for (const event of events) this.#failures.tell(event);
    if (this.#inFlight === 0) {
      queueMicrotask(this.#release);
      if (this.#drained.length > 0) for (const resolve of this.#drained.splice(0)) resolve();
    }
  }
}

function redisStore(options) {
  return new RedisStore(options);
}

module.exports = { redisStore, RedisStore };
