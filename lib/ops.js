'use strict';
// The operations of ratestore's stores beyond hit, as both stores share them:
// each op's number (as the native side knows it), the check of its arguments
// (a bad call is refused before any store is touched), its numbers, and how
// its answer (up to six integers) becomes the result object.

const { typeError, rangeError, typeName, rejection, invalidHit, MAX_KEY_LENGTH, MAX_SPAN_MS } = require('./check.js');
const { WATCHERS, told } = require('./watch.js');
const native = require('./native.js');

/**
 * Each op's number, as the native side numbers them (its `Op::ALL`, read through `opNames()`): hit,
 * consume, refund, slidingIncrement, slidingDecrement, slidingConsume, tokenBucket, unlink, ping, and
 * takes (several takes as one step, redisStore's `[TAKES]`: answers each take's answer under one call).
 */
const OP = Object.freeze(Object.fromEntries(native.opNames().map((name, code) => [name, code])));

/** Which state `unlink` removes: every algorithm's, for reset(key). */
const STATES = [0, 1, 2];
/**
 * A store's several takes as one step (memoryStore): `store[TAKES](takes)`, each take `{ op, key, a, b,
 * c, d }` (a consume, sliding consume or token bucket, its numbers checked), answers a promise of
 * `{ allowed, answers }`: every take was made, or none was (each answer then says what its take found).
 * A store may answer null instead, having done nothing, when it cannot make these takes one step (a
 * Redis Cluster whose slots the keys do not share): the caller then takes each on its own.
 */
const TAKES = Symbol('ratestore.takes');
/** The most takes one step holds. */
const MAX_TAKES = 16;
/** Where a store keeps its `slidingWindow` view. */
const SLIDING = Symbol('ratestore.slidingWindow');
/** A store's own resetAll(), which `resetAll()` runs, told to the block caches watching the store. */
const RESET_ALL = Symbol('ratestore.resetAll');

/** The ops a step's take may be. */
const TAKE_OPS = [OP.consume, OP.slidingConsume, OP.tokenBucket];

/**
 * The error of a step's `takes` that cannot be one (not 1 to MAX_TAKES takes, a take that is not a
 * consume, sliding consume or token bucket, or a bad key), or undefined. Each take's numbers are
 * checked by the native side, which refuses the whole step.
 */
function checkTakes(takes) {
  if (!Array.isArray(takes)) return typeError(`ratestore: a step's takes must be an array, got ${typeName(takes)}`);
  if (!(takes.length >= 1 && takes.length <= MAX_TAKES)) {
    return rangeError(`ratestore: a step holds 1 to ${MAX_TAKES} takes`);
  }
  for (const take of takes) {
    if (take === null || typeof take !== 'object') {
      return typeError(`ratestore: a step's take must be an object, got ${typeName(take)}`);
    }
    if (!TAKE_OPS.includes(take.op)) {
      return rangeError("ratestore: a step's take must be a consume, a sliding consume or a token bucket");
    }
    const error = checkKey("a step's take", take.key);
    if (error) return error;
  }
  return undefined;
}

/**
 * Runs a step (`run()`), telling the block caches watching `store` of each sliding window or bucket
 * take, as its own call would be told.
 */
function toldStep(store, takes, run) {
  if (store[WATCHERS] === undefined) return run();
  return takes.reduce((call, take) => {
    if (take.op === OP.slidingConsume) return () => told(store, 'sliding-params', take.key, take.a, call);
    if (take.op === OP.tokenBucket) {
      return () => told(store, 'bucket-params', take.key, `${take.a}/${take.b}/${take.c}`, call);
    }
    return call;
  }, run)();
}

function checkKey(call, key) {
  if (typeof key !== 'string') return typeError(`${call}: key must be a string, got ${typeName(key)}`);
  if (key.length > MAX_KEY_LENGTH) {
    return rangeError(`${call}: key is ${key.length} UTF-16 units long; at most ${MAX_KEY_LENGTH} are accepted`);
  }
  return undefined;
}

/** The error for a number argument that must be a safe integer of at least `min`, or undefined. */
function checkInteger(call, name, value, min) {
  if (typeof value !== 'number') return typeError(`${call}: ${name} must be a number, got ${typeName(value)}`);
  if (!(Number.isSafeInteger(value) && value >= min)) {
    const what = min === 1 ? 'a positive safe integer' : 'a safe integer of 0 or more';
    return rangeError(`${call}: ${name} must be ${what}, got ${value}`);
  }
  return undefined;
}

/** The error for a window's length or a bucket's interval: 1 to MAX_SPAN_MS ms, or undefined. */
function checkSpan(call, name, value) {
  const error = checkInteger(call, name, value, 1);
  if (error || value <= MAX_SPAN_MS) return error;
  return rangeError(`${call}: ${name} must be at most ${MAX_SPAN_MS} ms (2^52 µs), got ${value}`);
}

function checkObject(call, options) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    return typeError(`${call}: options must be an object, got ${typeName(options)}`);
  }
  return undefined;
}

/**
 * Each op's check and numbers: `args(...)` answers `[error]` or `[undefined, a, b, c, d]`.
 * The native side checks them again, so the core stays safe on its own.
 */
function consumeArgs(call, key, options) {
  const error = checkKey(call, key) ?? checkObject(call, options);
  if (error) return [error];
  const { limit, windowMs, cost = 1 } = options;
  const bad =
    checkInteger(call, 'limit', limit, 0) ??
    checkSpan(call, 'windowMs', windowMs) ??
    checkInteger(call, 'cost', cost, 0);
  return bad ? [bad] : [undefined, windowMs, limit, cost, 0];
}

function amountArgs(call, key, windowMs, amount) {
  const error = checkKey(call, key) ?? checkSpan(call, 'windowMs', windowMs) ?? checkInteger(call, 'amount', amount, 0);
  return error ? [error] : [undefined, windowMs, amount, 0, 0];
}

/**
 * A give-back's `{ window }`: the id its take answered, or 0 (sent for none: ids are above 0) when
 * `options` is undefined or names none, for today's give-back from whatever window is open.
 */
function windowArg(call, options) {
  if (options === undefined) return [undefined, 0];
  const error = checkObject(call, options);
  if (error) return [error];
  const { window } = options;
  if (window === undefined) return [undefined, 0];
  const bad = checkInteger(call, 'options.window', window, 1);
  return bad ? [bad] : [undefined, window];
}

function refundArgs(key, amount, options) {
  const call = 'refund(key, amount, options)';
  const error = checkKey(call, key) ?? checkInteger(call, 'amount', amount, 0);
  if (error) return [error];
  const [bad, window] = windowArg(call, options);
  return bad ? [bad] : [undefined, amount, window, 0, 0];
}

function decrementArgs(key, windowMs, amount, options) {
  const call = 'slidingWindow.decrement(key, windowMs, amount, options)';
  const [error, a, b] = amountArgs(call, key, windowMs, amount);
  if (error) return [error];
  const [bad, window] = windowArg(call, options);
  return bad ? [bad] : [undefined, a, b, window, 0];
}

function bucketArgs(key, options) {
  const call = 'tokenBucket(key, options)';
  const error = checkKey(call, key) ?? checkObject(call, options);
  if (error) return [error];
  const { capacity, refill, intervalMs, cost = 1 } = options;
  const bad =
    checkInteger(call, 'capacity', capacity, 1) ??
    checkInteger(call, 'refill', refill, 1) ??
    checkSpan(call, 'intervalMs', intervalMs) ??
    checkInteger(call, 'cost', cost, 0);
  if (bad) return [bad];
  // Filling from empty takes ceil(capacity / refill) intervals: within the same bound as a window.
  if (Math.ceil(capacity / refill) * intervalMs > MAX_SPAN_MS) {
    return [rangeError(`${call}: filling the bucket from empty must take at most ${MAX_SPAN_MS} ms`)];
  }
  return [undefined, capacity, refill, intervalMs, cost];
}

/** The result object of `op` from its answer's integers at `v[at..]`. */
function decode(op, v, at) {
  switch (op) {
    case OP.hit:
      return { count: v[at], resetMs: v[at + 1] };
    case OP.slidingIncrement:
    case OP.slidingDecrement:
      return { count: v[at], resetMs: v[at + 1], window: v[at + 2] };
    case OP.consume: {
      const allowed = v[at] === 1;
      const answer = { allowed, count: v[at + 1], remaining: v[at + 2], resetMs: v[at + 3] };
      answer.retryMs = allowed ? 0 : v[at + 3];
      answer.window = v[at + 4];
      return answer;
    }
    case OP.refund:
      // resetMs 0: no window was open, and none was opened.
      return v[at + 1] === 0 ? null : { count: v[at], resetMs: v[at + 1] };
    case OP.slidingConsume:
      return {
        allowed: v[at] === 1,
        count: v[at + 1],
        remaining: v[at + 2],
        resetMs: v[at + 3],
        retryMs: v[at + 4],
        window: v[at + 5],
      };
    case OP.tokenBucket:
      return { allowed: v[at] === 1, remaining: v[at + 1], retryMs: v[at + 2], resetMs: v[at + 3] };
    default:
      return undefined;
  }
}

/**
 * The operations every ratestore store offers, over its `call(op, key, a, b, c, d)`, which answers a
 * promise of the op's result object (rejecting if the store cannot do it).
 */
class Operations {
  /**
   * Runs one op whose arguments were checked, answering a promise of its result object: each store
   * defines its own (memory.js, redis.js, threaded.js).
   * @param {number} op @param {string} key @param {number} a @param {number} b @param {number} c
   * @param {number} d @returns {Promise<any>}
   */
  _call(op, key, a, b, c, d) {
    return rejection(
      Object.assign(new Error('ratestore: internal: a store without its _call'), { code: 'ERR_INTERNAL' }),
    );
  }

  consume(key, options) {
    const [error, a, b, c, d] = consumeArgs('consume(key, options)', key, options);
    return error ? rejection(error) : this._call(OP.consume, key, a, b, c, d);
  }

  refund(key, amount, options) {
    const [error, a, b, c, d] = refundArgs(key, amount, options);
    if (error) return rejection(error);
    if (this[WATCHERS] !== undefined)
      return told(this, 'fixed', key, undefined, () => this._call(OP.refund, key, a, b, c, d));
    return this._call(OP.refund, key, a, b, c, d);
  }

  /** The sliding window over this store, made once per store: it is read on every sliding call. */
  get slidingWindow() {
    const store = this;
    return (this[SLIDING] ??= {
      increment(key, windowMs, amount = 1) {
        const [error, a, b, c, d] = amountArgs('slidingWindow.increment(key, windowMs, amount)', key, windowMs, amount);
        if (error) return rejection(error);
        if (store[WATCHERS] !== undefined) {
          return told(store, 'sliding-params', key, a, () => store._call(OP.slidingIncrement, key, a, b, c, d));
        }
        return store._call(OP.slidingIncrement, key, a, b, c, d);
      },
      decrement(key, windowMs, amount = 1, options = undefined) {
        const [error, a, b, c, d] = decrementArgs(key, windowMs, amount, options);
        if (error) return rejection(error);
        if (store[WATCHERS] !== undefined) {
          return told(store, 'sliding', key, undefined, () => store._call(OP.slidingDecrement, key, a, b, c, d));
        }
        return store._call(OP.slidingDecrement, key, a, b, c, d);
      },
      consume(key, options) {
        const [error, a, b, c, d] = consumeArgs('slidingWindow.consume(key, options)', key, options);
        if (error) return rejection(error);
        if (store[WATCHERS] !== undefined) {
          return told(store, 'sliding-params', key, a, () => store._call(OP.slidingConsume, key, a, b, c, d));
        }
        return store._call(OP.slidingConsume, key, a, b, c, d);
      },
    });
  }

  tokenBucket(key, options) {
    const [error, a, b, c, d] = bucketArgs(key, options);
    if (error) return rejection(error);
    if (this[WATCHERS] !== undefined) {
      return told(this, 'bucket-params', key, `${a}/${b}/${c}`, () => this._call(OP.tokenBucket, key, a, b, c, d));
    }
    return this._call(OP.tokenBucket, key, a, b, c, d);
  }

  reset(key) {
    const error = checkKey('reset(key)', key);
    if (error) return rejection(error);
    const unlink = () =>
      Promise.all(STATES.map((state) => this._call(OP.unlink, key, state, 0, 0, 0))).then(() => undefined);
    return this[WATCHERS] !== undefined ? told(this, 'reset', key, undefined, unlink) : unlink();
  }

  /** Drops every counter of the store (its `[RESET_ALL]()`), told to the block caches watching it. */
  resetAll() {
    if (this[WATCHERS] !== undefined) return told(this, 'all', '', undefined, () => this[RESET_ALL]());
    return this[RESET_ALL]();
  }
}

/**
 * `open()` for a native store that reads the environment (`native.open(process.env)`) on its first
 * call, never at import or construction: it reads it once.
 */
function opener(native) {
  let opened = false;
  return () => {
    if (!opened) {
      opened = true;
      native.open(process.env);
    }
  };
}

/**
 * The operations of a store whose native side holds connections or a file and answers on its own time
 * (redisStore, postgresStore, mysqlStore, sqliteStore), and what their faces share: the native store
 * and its calls in flight, `stats()`'s common entries, `close()`.
 */
class ServerOperations extends Operations {
  #native;
  #failures;
  #inFlight;
  #kind;
  #figures;
  #beforeClose;
  /** Calls made (plain integers: the event loop is one thread). */
  #calls = 0;

  /**
   * Takes the native store the subclass made, once its options are checked: `kind` (stats().kind),
   * `native`, its `failures` and `inFlight`, `figures(native)` (its own entries of stats()), `opens`
   * (whether it reads the environment, `native.open(process.env)`, before its first call),
   * `beforeClose()` (what goes out before the native store closes). Answers the store's `open()`.
   */
  _serve({ kind, native, failures, inFlight, figures, opens = true, beforeClose = () => {} }) {
    this.#kind = kind;
    this.#native = native;
    this.#failures = failures;
    this.#inFlight = inFlight;
    this.#figures = figures;
    this.#beforeClose = beforeClose;
    return opens ? opener(native) : () => {};
  }

  /** Counts `n` calls made (less, for a call taken back), for stats(). */
  _count(n) {
    this.#calls += n;
  }

  /**
   * This store's calls and failures, and its native side's own figures (for redisStore, its
   * connections', shared by the stores that share them). Latencies are in ms.
   */
  stats() {
    return {
      kind: this.#kind,
      calls: this.#calls,
      errors: this.#failures.snapshot(),
      inFlight: this.#inFlight.count,
      ...this.#figures(this.#native),
    };
  }

  /** Refuses later calls (ERR_CLOSED) and ends the connections or file; resolves once the calls in flight have settled. */
  close() {
    this.#beforeClose();
    this.#native.close();
    return this.#inFlight.drained();
  }

  hit(key, windowMs, amount) {
    const invalid = invalidHit(key, windowMs, amount);
    if (invalid !== undefined) return rejection(invalid);
    if (amount < 0 && this[WATCHERS] !== undefined) {
      return told(this, 'fixed', key, undefined, () => this._call(OP.hit, key, windowMs, amount, 0, 0));
    }
    return this._call(OP.hit, key, windowMs, amount, 0, 0);
  }

  /** One round trip to the server (connecting first if need be); rejects as a hit would. */
  ping() {
    return this._call(OP.ping, '', 0, 0, 0, 0).then(() => undefined);
  }

  /** Opens the connection now, before the first hit: resolves once a ping through it is answered. */
  connect() {
    return this.ping();
  }
}

module.exports = {
  OP,
  Operations,
  ServerOperations,
  decode,
  WATCHERS,
  TAKES,
  MAX_TAKES,
  RESET_ALL,
  checkTakes,
  toldStep,
  opener,
};
