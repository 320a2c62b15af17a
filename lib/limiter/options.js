'use strict';
// createLimiter's options: each limit checked and completed (its algorithm, name, quota, policy window
// and store call), the sets of limits of every tier, the block cache's and the fallback's options, and
// the limits asked per request, resolved for one.

const { checkOptions, typeError, rangeError, MAX_SPAN_MS } = require('../check.js');
const { supports, TAKES_BY_ALGORITHM, takeAllOf, leaseKey } = require('./takes.js');

const ALGORITHMS = ['fixed-window', 'sliding-window', 'token-bucket', 'concurrency'];
const WINDOW_OPTIONS = ['algorithm', 'name', 'limit', 'windowMs'];
const BUCKET_OPTIONS = ['algorithm', 'name', 'capacity', 'refill', 'intervalMs'];
const LEASE_OPTIONS = ['algorithm', 'name', 'limit', 'leaseMs'];
/** The most leases a concurrency limit holds at once (each is a counter of its own). */
const MAX_LEASES = 256;
const COMMON_OPTIONS = ['store', 'headers', 'failOpen', 'blockCache', 'fallback', 'onError', 'hashTag'];
/** Policy names: sf-string characters (no quote, no backslash), and short. */
const NAME = /^[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}$/;

// Options

/** An option's name for a message: `limit`, or `limits[1].limit`, `tiers.pro.windowMs`. */
const at = (path, name) => (path === '' ? name : `${path}.${name}`);
const fail = (make, message) => make(`createLimiter(options): ${message}`);

function checkInteger(path, name, value, min, max = Number.MAX_SAFE_INTEGER) {
  if (typeof value !== 'number') {
    throw fail(typeError, `${at(path, name)} must be a number, got ${value === null ? 'null' : typeof value}`);
  }
  if (!(Number.isSafeInteger(value) && value >= min && value <= max)) {
    const bound = max === Number.MAX_SAFE_INTEGER ? '' : ` up to ${max}`;
    throw fail(rangeError, `${at(path, name)} must be a safe integer of ${min} or more${bound}, got ${value}`);
  }
}

/** express-rate-limit's default policy name (`60-in-1min`), so that draft-8 headers read the same. */
function duration(ms) {
  const s = ms / 1000;
  if (s < 60) return `${s}sec`;
  if (s < 3600) return `${s / 60}min`;
  const hours = s / 3600;
  if (hours < 24) return `${hours}hr${hours > 1 ? 's' : ''}`;
  const days = hours / 24;
  return `${days}day${days > 1 ? 's' : ''}`;
}

/** One limit's options, checked and completed: its algorithm, name, quota, policy window and store call. */
function readLimit(path, limit, store) {
  if (limit === null || typeof limit !== 'object' || Array.isArray(limit)) {
    throw fail(typeError, `${path} must be a limit (an object)`);
  }
  const { algorithm = 'fixed-window' } = limit;
  if (!ALGORITHMS.includes(algorithm)) {
    const make = typeof algorithm === 'string' ? rangeError : typeError;
    throw fail(make, `${at(path, 'algorithm')} must be one of ${ALGORITHMS.map((a) => `'${a}'`).join(', ')}`);
  }
  const bucket = algorithm === 'token-bucket';
  const lease = algorithm === 'concurrency';
  const known = bucket ? BUCKET_OPTIONS : lease ? LEASE_OPTIONS : WINDOW_OPTIONS;
  for (const option of Object.keys(limit)) {
    if (!known.includes(option)) {
      throw fail(
        typeError,
        `unknown option "${at(path, option)}" for a ${algorithm} limit; its options are ${known.join(', ')}`,
      );
    }
  }
  let rule;
  if (bucket) {
    const { capacity, refill, intervalMs } = limit;
    checkInteger(path, 'capacity', capacity, 1);
    checkInteger(path, 'refill', refill, 1);
    checkInteger(path, 'intervalMs', intervalMs, 1);
    // The bucket's policy window: the time it takes to fill from empty.
    const windowMs = Math.ceil(capacity / refill) * intervalMs;
    if (windowMs > MAX_SPAN_MS) {
      throw fail(rangeError, `${path || 'the bucket'}: filling from empty must take at most ${MAX_SPAN_MS} ms`);
    }
    const name = `${capacity}-per-${refill}-in-${duration(intervalMs)}`;
    rule = { algorithm, name, limit: capacity, windowMs, capacity, refill, intervalMs };
  } else if (lease) {
    checkInteger(path, 'limit', limit.limit, 1, MAX_LEASES);
    checkInteger(path, 'leaseMs', limit.leaseMs, 1, MAX_SPAN_MS);
    rule = { algorithm, name: `${limit.limit}-concurrent`, limit: limit.limit, windowMs: limit.leaseMs };
    rule.leaseMs = limit.leaseMs;
  } else {
    // Either may be a function, asked on each check (see resolve()).
    const perRequest = {};
    if (typeof limit.limit === 'function') perRequest.limit = limit.limit;
    else checkInteger(path, 'limit', limit.limit, 0);
    if (typeof limit.windowMs === 'function') perRequest.windowMs = limit.windowMs;
    else checkInteger(path, 'windowMs', limit.windowMs, 1, MAX_SPAN_MS);
    if (perRequest.limit !== undefined || perRequest.windowMs !== undefined) {
      rule = { algorithm, name: 'per-request', limit: limit.limit, windowMs: limit.windowMs, perRequest, path };
    } else {
      rule = { algorithm, name: `${limit.limit}-in-${duration(limit.windowMs)}`, limit: limit.limit };
      rule.windowMs = limit.windowMs;
    }
  }
  if (limit.name !== undefined) {
    if (typeof limit.name !== 'string') throw fail(typeError, `${at(path, 'name')} must be a string`);
    if (!NAME.test(limit.name)) {
      throw fail(rangeError, `${at(path, 'name')} must be 1 to 64 printable ASCII characters, without " or \\`);
    }
    rule.name = limit.name;
  }
  if (algorithm !== 'fixed-window' && !supports(store, algorithm)) {
    throw fail(
      typeError,
      `the ${algorithm} algorithm needs one of ratestore's stores (memoryStore() or redisStore()); ` +
        'this store has only hit, which counts fixed windows',
    );
  }
  rule.take = TAKES_BY_ALGORITHM[algorithm](store);
  return rule;
}

/** The limits of one tier (or of every key): checked together, each under a key of its own when there are several. */
function readSet(path, value, store) {
  const list = Array.isArray(value) ? value : [value];
  if (list.length === 0) throw fail(rangeError, `${path} must hold at least one limit`);
  // Every element, holes included (map would skip them): a hole is no limit.
  const rules = Array.from(list, (limit, i) => {
    if (Array.isArray(value) && !Object.hasOwn(value, i))
      throw fail(typeError, `${path}[${i}] must be a limit, got a hole`);
    return readLimit(Array.isArray(value) ? `${path}[${i}]` : path, limit, store);
  });
  const names = new Set();
  for (const rule of rules) {
    if (names.has(rule.name)) {
      throw fail(rangeError, `${path}: two limits are named "${rule.name}"; give each a name of its own`);
    }
    names.add(rule.name);
  }
  // Taken tokens cannot be given back, so a bucket goes last, once every other limit allowed; a
  // second one could leave tokens spent on a request the other refused.
  if (rules.filter((rule) => rule.algorithm === 'concurrency').length > 1) {
    throw fail(rangeError, `${path}: at most one concurrency limit per request`);
  }
  if (rules.filter((rule) => rule.algorithm === 'token-bucket').length > 1) {
    throw fail(
      rangeError,
      `${path}: at most one token-bucket limit per request, since taken tokens cannot be given back`,
    );
  }
  for (const rule of rules) rule.suffix = rules.length === 1 ? '' : `:${rule.name}`;
  const steps = rules.filter((rule) => rule.algorithm !== 'concurrency');
  return {
    windows: steps.filter((rule) => rule.algorithm !== 'token-bucket'),
    bucket: rules.find((rule) => rule.algorithm === 'token-bucket'),
    lease: rules.find((rule) => rule.algorithm === 'concurrency'),
    rules,
    steps,
    longestSuffix: Math.max(
      ...rules.map(
        (rule) => rule.suffix.length + (rule.leaseMs === undefined ? 0 : leaseKey('', rule.limit - 1).length),
      ),
    ),
    takeAll: steps.length > 1 ? takeAllOf(store, steps) : undefined,
    perRequest: rules.some((rule) => rule.perRequest !== undefined),
    store,
  };
}

/** Entries a block cache holds by default. */
const CACHE_MAX_KEYS = 10_000;
/** Bytes a block cache's entries are counted as, at most, by default (an entry is at most ~1 KB). */
const CACHE_MAX_BYTES = 16 * 1024 * 1024;
/** Milliseconds between probes of a failing main store, by default. */
const PROBE_MS = 250;

/** `blockCache`: undefined (off) or its `{ maxKeys, maxBytes }`. On by default for a shared store. */
function readCache(blockCache, store) {
  const defaults = { maxKeys: CACHE_MAX_KEYS, maxBytes: CACHE_MAX_BYTES };
  if (blockCache === undefined) return store.shared === true ? defaults : undefined;
  if (blockCache === false) return undefined;
  if (blockCache === true) return defaults;
  if (blockCache === null || typeof blockCache !== 'object' || Array.isArray(blockCache)) {
    throw fail(typeError, 'blockCache must be a boolean or { maxKeys, maxBytes }');
  }
  const { maxKeys = CACHE_MAX_KEYS, maxBytes = CACHE_MAX_BYTES } = checkOptions(
    'createLimiter',
    blockCache,
    ['maxKeys', 'maxBytes'],
    'blockCache',
  );
  checkInteger('blockCache', 'maxKeys', maxKeys, 1);
  checkInteger('blockCache', 'maxBytes', maxBytes, 4096);
  return { maxKeys, maxBytes };
}

/** `fallback`: a store, or `{ store, scale, probeMs }`; answers undefined or the three. */
function readFallback(fallback) {
  if (fallback === undefined) return undefined;
  const isStore = (s) => s !== null && typeof s === 'object' && typeof s.hit === 'function';
  let options = { store: fallback };
  if (!isStore(fallback)) {
    if (fallback === null || typeof fallback !== 'object' || Array.isArray(fallback)) {
      throw fail(typeError, 'fallback must be a RateLimitStore or { store, scale, probeMs }');
    }
    options = checkOptions('createLimiter', fallback, ['store', 'scale', 'probeMs'], 'fallback');
    if (!isStore(options.store)) {
      throw fail(typeError, 'fallback.store must be a RateLimitStore (an object with a hit method)');
    }
  }
  const { store, scale = 1, probeMs = PROBE_MS } = options;
  if (typeof scale !== 'number') throw fail(typeError, `fallback.scale must be a number, got ${typeof scale}`);
  if (!(scale > 0 && scale <= 1)) throw fail(rangeError, `fallback.scale must be above 0 and at most 1, got ${scale}`);
  checkInteger('fallback', 'probeMs', probeMs, 1);
  return { store, scale, probeMs };
}

/** A limit's options with its quota scaled for the fallback, under the main limit's name. */
function scaled(limit, rule, scale) {
  const out = { ...limit, name: rule.name };
  if (rule.algorithm === 'token-bucket') {
    out.capacity = Math.max(1, Math.floor(limit.capacity * scale));
    out.refill = Math.max(1, Math.floor(limit.refill * scale));
  } else {
    // At least 1, as a bucket's: a scaled limit of 0 would refuse every request while the store is down.
    const scale1 = (n) => (typeof n !== 'number' || n === 0 ? n : Math.max(1, Math.floor(n * scale)));
    const given = limit.limit;
    out.limit = typeof given === 'function' ? (key, info) => scale1(given(key, info)) : scale1(given);
  }
  return out;
}

/**
 * A set whose limits (or windows) are asked per request, resolved for this one: each such rule a copy
 * with the numbers its functions answered (checked as the options are), under its tag and suffix.
 * Throws a TypeError or RangeError naming the limit for an answer out of range.
 */
function resolve(set, key, info) {
  if (!set.perRequest) return set;
  const rules = set.rules.map((rule) => {
    if (rule.perRequest === undefined) return rule;
    const out = { ...rule };
    for (const [option, ask] of Object.entries(rule.perRequest)) {
      const value = ask(key, info);
      const where = `check(key): ${at(rule.path, option)}(key, info) answered`;
      if (typeof value !== 'number')
        throw typeError(`${where} ${value === null ? 'null' : typeof value}, not a number`);
      const [min, max] = option === 'limit' ? [0, Number.MAX_SAFE_INTEGER] : [1, MAX_SPAN_MS];
      if (!(Number.isSafeInteger(value) && value >= min && value <= max)) {
        throw rangeError(`${where} ${value}; it must be a safe integer from ${min} to ${max}`);
      }
      out[option] = value;
    }
    return out;
  });
  const steps = rules.filter((rule) => rule.algorithm !== 'concurrency');
  const out = {
    ...set,
    rules,
    steps,
    windows: steps.filter((rule) => rule.algorithm !== 'token-bucket'),
    bucket: rules.find((rule) => rule.algorithm === 'token-bucket'),
    lease: rules.find((rule) => rule.algorithm === 'concurrency'),
    takeAll: set.takeAll === undefined ? undefined : takeAllOf(set.store, steps),
  };
  if (set.fallback !== undefined) out.fallback = resolve(set.fallback, key, info);
  return out;
}

module.exports = {
  ALGORITHMS,
  WINDOW_OPTIONS,
  BUCKET_OPTIONS,
  LEASE_OPTIONS,
  COMMON_OPTIONS,
  readSet,
  readCache,
  readFallback,
  scaled,
  resolve,
};
