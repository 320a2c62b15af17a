'use strict';
// Adapters that give other rate limiters a ratestore store: universal-rate-limit's Store and
// express-rate-limit's. Each call is one operation of the store's chosen algorithm, so counts keep
// the store's guarantees (atomic per key, shared when the store is). The one state kept here is
// which window each key's recent hits went into, so that a decrement gives back only to it.

const { memoryStore } = require('./memory.js');
const {
  checkOptions,
  checkOption,
  checkWellFormed,
  typeName,
  typeError,
  rangeError,
  MAX_SPAN_MS,
} = require('./check.js');

/**
 * What an adapter does with each algorithm: a counted hit that answers its window, a decrement that
 * gives back to that window only (and opens nothing), a read.
 */
const ALGORITHMS = {
  'fixed-window': {
    increment: async (store, key, windowMs) => {
      // consume with no limit to speak of is hit(key, windowMs, 1) that also answers its window; at
      // the top of the count's range, hit itself rejects as it does.
      const answer = await store.consume(key, { limit: Number.MAX_SAFE_INTEGER, windowMs, cost: 1 });
      return answer.allowed ? answer : store.hit(key, windowMs, 1);
    },
    // refund never opens a window and never goes below 0; named a window that is not open, it changes nothing.
    decrement: (store, key, windowMs, window) => store.refund(key, window === undefined ? 0 : 1, { window }),
    read: (store, key) => store.refund(key, 0),
  },
  'sliding-window': {
    increment: (store, key, windowMs) => store.slidingWindow.increment(key, windowMs, 1),
    decrement: (store, key, windowMs, window) =>
      store.slidingWindow.decrement(key, windowMs, window === undefined ? 0 : 1, { window }),
    // No state and a state that counts nothing read alike: 0.
    read: async (store, key, windowMs) => {
      const state = await store.slidingWindow.increment(key, windowMs, 0);
      return state.count > 0 ? state : null;
    },
  },
};

const ALGORITHM_NAMES = Object.keys(ALGORITHMS)
  .map((name) => `'${name}'`)
  .join(' or ');

function algorithmOf(factory, algorithm) {
  checkOption(factory, 'algorithm', algorithm, 'string');
  if (!Object.hasOwn(ALGORITHMS, algorithm)) {
    throw rangeError(`${factory}(options): algorithm must be ${ALGORITHM_NAMES}, got ${JSON.stringify(algorithm)}`);
  }
  return ALGORITHMS[algorithm];
}

/** The store option: one of ratestore's stores, which offer refund, the sliding window and reset. */
function storeOf(factory, store) {
  if (store === undefined) return memoryStore();
  const fits =
    store !== null &&
    typeof store === 'object' &&
    ['hit', 'refund', 'reset', 'resetAll'].every((name) => typeof store[name] === 'function') &&
    store.slidingWindow !== null &&
    typeof store.slidingWindow === 'object' &&
    typeof store.slidingWindow.increment === 'function' &&
    typeof store.slidingWindow.decrement === 'function';
  if (!fits) {
    throw typeError(
      `${factory}(options): store must be a ratestore store (memoryStore() or redisStore()); ` +
        'a store with only hit() cannot decrement or reset',
    );
  }
  return store;
}

/** Throws the TypeError of a key that is not a string; the key itself is never named. */
function checkKey(factory, method, key) {
  if (typeof key !== 'string') {
    throw typeError(`${factory}: ${method}(key): key must be a string, got ${typeName(key)}`);
  }
}

/** Checks a required windowMs (`where` names the call): a positive safe integer. */
function checkWindowMs(where, windowMs) {
  if (typeof windowMs !== 'number') {
    throw typeError(`${where}: windowMs must be a number (the window length in ms), got ${typeName(windowMs)}`);
  }
  if (!(windowMs >= 1 && Number.isSafeInteger(windowMs))) {
    throw rangeError(`${where}: windowMs must be a positive safe integer (ms), got ${windowMs}`);
  }
  if (windowMs > MAX_SPAN_MS) {
    throw rangeError(`${where}: windowMs must be at most ${MAX_SPAN_MS} ms (2^52 µs), got ${windowMs}`);
  }
}

/** Keys whose hits an adapter remembers the windows of; past this, the least recently hit is forgotten. */
const REMEMBERED_KEYS = 10_000;

/**
 * Which window each key's recent increments went into, so that a decrement (which names no request)
 * gives back only what an increment took, to the window it took it from:
 * - `n` increments in the key's latest window, and `carry` in the window before, not yet given back;
 * - a decrement goes to the window before while its `carry` lasts (the oldest requests' first: a
 *   fixed window that has ended then changes nothing; a sliding window takes it from its previous
 *   count), then to the latest window, and does nothing once both are spent;
 * - a key not remembered (forgotten, or reset) is given nothing back: the request stays counted (the
 *   decrement is then a read, so that a failing store still rejects).
 * So a window's count never goes below the increments made in it that were not given back, as long
 * as a request's decrement arrives before the key's window after next opens.
 */
class Windows {
  #keys = new Map();

  /** Notes an increment of `key` counted in `window`. */
  took(key, window) {
    const last = this.#keys.get(key);
    this.#keys.delete(key);
    let entry;
    if (last !== undefined && last.window === window) entry = { ...last, n: last.n + 1 };
    else entry = { window, n: 1, before: last?.window, carry: last?.n ?? 0 };
    this.#keys.set(key, entry);
    if (this.#keys.size > REMEMBERED_KEYS) this.#keys.delete(this.#keys.keys().next().value);
  }

  /** The window a decrement of `key` gives back to, or undefined for none (then nothing is given back). */
  giveBack(key) {
    const entry = this.#keys.get(key);
    if (entry === undefined) return undefined;
    if (entry.carry > 0) {
      entry.carry -= 1;
      return entry.before;
    }
    if (entry.n > 0) {
      entry.n -= 1;
      return entry.window;
    }
    return undefined;
  }

  forget(key) {
    this.#keys.delete(key);
  }

  forgetAll() {
    this.#keys.clear();
  }
}

/** A count and resetMs as the limiters take them: the window's end as a Date. */
function clientInfo({ count, resetMs }) {
  return { totalHits: count, resetTime: new Date(Date.now() + resetMs) };
}

const UNIVERSAL_OPTIONS = ['windowMs', 'algorithm', 'store'];

/** universal-rate-limit's Store (increment, decrement, resetKey, resetAll) over a ratestore store. */
class UniversalStore {
  #store;
  #algorithm;
  #windowMs;
  #windows = new Windows();

  constructor(options) {
    const { windowMs, algorithm = 'fixed-window', store } = checkOptions('universalStore', options, UNIVERSAL_OPTIONS);
    checkWindowMs('universalStore(options)', windowMs);
    this.#algorithm = algorithmOf('universalStore', algorithm);
    this.#store = storeOf('universalStore', store);
    this.#windowMs = windowMs;
  }

  async increment(key) {
    checkKey('universalStore', 'increment', key);
    const answer = await this.#algorithm.increment(this.#store, key, this.#windowMs);
    this.#windows.took(key, answer.window);
    return clientInfo(answer);
  }

  async decrement(key) {
    checkKey('universalStore', 'decrement', key);
    // With no window to give back to, a read: it changes nothing, but a failing store still rejects.
    await this.#algorithm.decrement(this.#store, key, this.#windowMs, this.#windows.giveBack(key));
  }

  async resetKey(key) {
    checkKey('universalStore', 'resetKey', key);
    this.#windows.forget(key);
    await this.#store.reset(key);
  }

  async resetAll() {
    this.#windows.forgetAll();
    await this.#store.resetAll();
  }

  /** Nothing to stop: ratestore's stores sweep without a timer, and the store stays usable. */
  shutdown() {}
}

function universalStore(options) {
  return new UniversalStore(options);
}

const EXPRESS_OPTIONS = ['store', 'algorithm', 'prefix'];

/**
 * Which expressStore counts on each ratestore store under each prefix. express-rate-limit refuses
 * one Store object in two limiters, but cannot see two adapters over one store and one prefix,
 * which count every request twice just the same.
 */
const claims = new WeakMap();

function notInitialized() {
  return Object.assign(
    new Error(
      "ratestore: expressStore: init() was not called; pass the store to express-rate-limit's rateLimit({ store }), " +
        'which calls init() with its windowMs',
    ),
    { code: 'ERR_NOT_INITIALIZED' },
  );
}

/** express-rate-limit's Store (v7 and v8) over a ratestore store. */
class ExpressStore {
  #store;
  #algorithm;
  #windowMs;
  #prefix;
  #windows = new Windows();

  constructor(options) {
    const { store, algorithm = 'fixed-window', prefix = '' } = checkOptions('expressStore', options, EXPRESS_OPTIONS);
    this.#algorithm = algorithmOf('expressStore', algorithm);
    checkWellFormed('expressStore', 'prefix', prefix);
    this.#store = storeOf('expressStore', store);
    this.#prefix = prefix;
  }

  /** Whether the counters are this process's alone (a memoryStore): express-rate-limit's checks read it. */
  get localKeys() {
    return !this.#store.shared;
  }

  /** Prepended to every key, so that limiters sharing one store count apart. */
  get prefix() {
    return this.#prefix;
  }

  /** Called by rateLimit() with its options; takes their windowMs. Errors are logged by express-rate-limit. */
  init(options) {
    if (options === null || typeof options !== 'object') {
      throw typeError(`expressStore: init(options): options must be an object, got ${typeName(options)}`);
    }
    checkWindowMs('expressStore: init(options)', options.windowMs);
    if (this.#windowMs !== undefined) {
      throw new Error('ratestore: expressStore: init() was called again; give each rateLimit() a store of its own');
    }
    this.#windowMs = options.windowMs;
    let byPrefix = claims.get(this.#store);
    if (byPrefix === undefined) claims.set(this.#store, (byPrefix = new Map()));
    const holder = byPrefix.get(this.#prefix)?.deref();
    if (holder !== undefined && holder !== this) {
      throw new Error(
        'ratestore: expressStore: another expressStore already counts on this ratestore store with the same prefix, ' +
          'so both limiters would count every request; give each expressStore its own prefix (or store)',
      );
    }
    byPrefix.set(this.#prefix, new WeakRef(this));
  }

  #windowOrThrow() {
    if (this.#windowMs === undefined) throw notInitialized();
    return this.#windowMs;
  }

  /** The key's count and window end, or undefined when nothing counts against it. */
  async get(key) {
    checkKey('expressStore', 'get', key);
    const state = await this.#algorithm.read(this.#store, this.#prefix + key, this.#windowOrThrow());
    return state === null ? undefined : clientInfo(state);
  }

  async increment(key) {
    checkKey('expressStore', 'increment', key);
    const windowMs = this.#windowOrThrow();
    const answer = await this.#algorithm.increment(this.#store, this.#prefix + key, windowMs);
    this.#windows.took(key, answer.window);
    return clientInfo(answer);
  }

  async decrement(key) {
    checkKey('expressStore', 'decrement', key);
    const windowMs = this.#windowOrThrow();
    // With no window to give back to, a read: it changes nothing, but a failing store still rejects.
    await this.#algorithm.decrement(this.#store, this.#prefix + key, windowMs, this.#windows.giveBack(key));
  }

  async resetKey(key) {
    checkKey('expressStore', 'resetKey', key);
    this.#windows.forget(key);
    await this.#store.reset(this.#prefix + key);
  }

  /** Empties the whole ratestore store, other limiters' keys included when they share it. */
  async resetAll() {
    this.#windows.forgetAll();
    await this.#store.resetAll();
  }

  /**
   * Lets another expressStore take this one's store and prefix. Stops no timer (there is none) and
   * leaves the ratestore store open: it belongs to the caller, who may share it.
   */
  shutdown() {
    const byPrefix = claims.get(this.#store);
    if (byPrefix?.get(this.#prefix)?.deref() === this) byPrefix.delete(this.#prefix);
  }
}

function expressStore(options) {
  return new ExpressStore(options);
}

module.exports = { universalStore, expressStore, UniversalStore, ExpressStore };
