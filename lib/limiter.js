'use strict';
// createLimiter: the limits of a request (one, several, or those of its
// tier) checked against a store, with the answer's headers. On ratestore's
// own stores each limit is one atomic, limit-aware call, and what a request
// took is given back only to the window it took it from; on any other
// RateLimitStore a fixed window is a hit, never given back.

const {
  checkOptions,
  checkOption,
  typeError,
  rangeError,
  rejection,
  MAX_KEY_LENGTH,
  MAX_SPAN_MS,
} = require('./check.js');
const { STYLES, limitHeaders } = require('./headers.js');
const { BlockCache } = require('./block-cache.js');
const { watch } = require('./watch.js');
const { Operations, OP, TAKES, MAX_TAKES } = require('./ops.js');

const ALGORITHMS = ['fixed-window', 'sliding-window', 'token-bucket', 'concurrency'];
const WINDOW_OPTIONS = ['algorithm', 'name', 'limit', 'windowMs'];
const BUCKET_OPTIONS = ['algorithm', 'name', 'capacity', 'refill', 'intervalMs'];
const LEASE_OPTIONS = ['algorithm', 'name', 'limit', 'leaseMs'];
/** The most leases a concurrency limit holds at once (each is a counter of its own). */
const MAX_LEASES = 256;
const COMMON_OPTIONS = ['store', 'headers', 'failOpen', 'blockCache', 'fallback', 'onError', 'hashTag'];
/** Policy names: sf-string characters (no quote, no backslash), and short. */
const NAME = /^[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}$/;

// ---------------------------------------------------------------------------
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

function supports(store, algorithm) {
  switch (algorithm) {
    case 'fixed-window':
      return typeof store.consume === 'function' && typeof store.refund === 'function';
    case 'sliding-window': {
      const sliding = store.slidingWindow;
      return sliding != null && typeof sliding.consume === 'function' && typeof sliding.decrement === 'function';
    }
    case 'token-bucket':
      return typeof store.tokenBucket === 'function';
    case 'concurrency':
      return supports(store, 'fixed-window');
  }
  return false;
}

// ---------------------------------------------------------------------------
// One limit against the store. A take answers { allowed, count?, remaining, resetMs, retryMs } and,
// when it took something that can be given back, giveBack(): a promise of the new remaining count.

/**
 * A fixed window over ratestore's consume: one atomic call; a refusal changes nothing. The give-back
 * names the window the cost went into, so that landing after its end (in a window another request
 * opened) it changes nothing.
 */
function takeConsume(store) {
  return async (key, rule, cost) => {
    const answer = await store.consume(key, { limit: rule.limit, windowMs: rule.windowMs, cost });
    return {
      allowed: answer.allowed,
      remaining: answer.remaining,
      resetMs: answer.resetMs,
      retryMs: answer.allowed ? 0 : answer.resetMs,
      giveBack: async () => {
        const back = await store.refund(key, cost, { window: answer.window });
        // null: its window has ended; the count is that of a window that no longer counts.
        return back === null ? undefined : back.count;
      },
    };
  };
}

/**
 * A fixed window over a store that has only hit: the hit counts, and is never given back, whether
 * this limit refused or another one did. A hit of -cost cannot say which window it lands in (late, it
 * would take from, or open at -cost, the window another request opened), so a refused hit stays
 * counted: then in every window the counts only grow, and the allowed requests' costs sum to at most
 * the limit (docs/algorithms.md, "Give-backs").
 */
function takeHit(store) {
  return async (key, rule, cost) => {
    const hit = await store.hit(key, rule.windowMs, cost);
    if (
      hit === null ||
      typeof hit !== 'object' ||
      !Number.isSafeInteger(hit.count) ||
      typeof hit.resetMs !== 'number' ||
      !(hit.resetMs >= 0 && hit.resetMs <= Number.MAX_SAFE_INTEGER)
    ) {
      throw malformed();
    }
    const allowed = hit.count <= rule.limit;
    return {
      allowed,
      remaining: remainingOf(rule, hit.count),
      resetMs: hit.resetMs,
      retryMs: allowed ? 0 : hit.resetMs,
    };
  };
}

function takeSliding(store) {
  const sliding = store.slidingWindow;
  return async (key, rule, cost) => {
    const answer = await sliding.consume(key, { limit: rule.limit, windowMs: rule.windowMs, cost });
    return {
      allowed: answer.allowed,
      remaining: answer.remaining,
      resetMs: answer.resetMs,
      retryMs: answer.retryMs,
      // Only to the window the cost went into (or, a window on, to the previous one it now is).
      giveBack: async () => (await sliding.decrement(key, rule.windowMs, cost, { window: answer.window })).count,
    };
  };
}

function takeBucket(store) {
  return async (key, rule, cost) => {
    const options = { capacity: rule.capacity, refill: rule.refill, intervalMs: rule.intervalMs, cost };
    const answer = await store.tokenBucket(key, options);
    return { allowed: answer.allowed, remaining: answer.remaining, resetMs: answer.resetMs, retryMs: answer.retryMs };
  };
}

/**
 * Several limits as one step, where the store offers it (memoryStore: one critical section): every
 * limit takes the cost, or none does. Answers undefined for a store without it; else a function of
 * (key, cost) answering each rule's answer, in order, with nothing to give back: a refused check took
 * nothing, and a limit that would have allowed says what it has left untouched. It answers undefined,
 * having taken nothing, when the store cannot make this key's takes one step (a Redis Cluster whose
 * slots the keys do not share): the limits are then taken one by one, as on a store without it.
 */
function takeAllOf(store, rules) {
  if (typeof store[TAKES] !== 'function' || rules.length > MAX_TAKES) return undefined;
  return async (key, cost) => {
    const takes = rules.map((rule) => {
      const k = key + rule.suffix;
      if (rule.algorithm === 'token-bucket') {
        return { op: OP.tokenBucket, key: k, a: rule.capacity, b: rule.refill, c: rule.intervalMs, d: cost };
      }
      const op = rule.algorithm === 'sliding-window' ? OP.slidingConsume : OP.consume;
      return { op, key: k, a: rule.windowMs, b: rule.limit, c: cost, d: 0 };
    });
    const step = await store[TAKES](takes);
    if (step === null) return undefined;
    const { allowed, answers } = step;
    return answers.map((answer, i) => {
      const limit = rules[i].limit;
      // Not taken: what it found, the cost not spent.
      const remaining = allowed || !answer.allowed ? answer.remaining : Math.min(limit, answer.remaining + cost);
      return { allowed: answer.allowed, remaining, resetMs: answer.resetMs, retryMs: answer.retryMs };
    });
  };
}

/** The key of a concurrency limit's lease `i`: a fixed window of its own, of 1. */
const leaseKey = (key, i) => `${key}:lease:${i}`;

/**
 * A concurrency limit: at most `limit` leases of a key at once, each a fixed window of 1 under a key
 * of its own (`key:lease:i`) that ends `leaseMs` after it was taken, so that a lease a crashed process
 * never gave back ends by itself. A take looks for a free lease from a random one on (one consume
 * each, in turn: none is taken to be given back); its release gives back to the window it took only,
 * so a release after the lease ended (and another request took it) frees nothing. A check takes one
 * lease, whatever its cost.
 */
function takeLease(store) {
  return async (key, rule) => {
    const n = rule.limit;
    const first = Math.floor(Math.random() * n);
    let busy = 0;
    let soonest = rule.leaseMs;
    for (let j = 0; j < n; j++) {
      const k = leaseKey(key, (first + j) % n);
      const answer = await store.consume(k, { limit: 1, windowMs: rule.leaseMs, cost: 1 });
      if (!answer.allowed) {
        busy++;
        soonest = Math.min(soonest, answer.resetMs);
        continue;
      }
      let released;
      const release = () => {
        released ??= store.refund(k, 1, { window: answer.window }).then(() => undefined);
        return released;
      };
      return {
        allowed: true,
        remaining: Math.max(0, n - 1 - busy),
        resetMs: rule.leaseMs,
        retryMs: 0,
        release,
        giveBack: async () => {
          await release();
          return undefined;
        },
      };
    }
    return { allowed: false, remaining: 0, resetMs: soonest, retryMs: soonest };
  };
}

const TAKES_BY_ALGORITHM = {
  concurrency: takeLease,
  'fixed-window': (store) => (supports(store, 'fixed-window') ? takeConsume(store) : takeHit(store)),
  'sliding-window': takeSliding,
  'token-bucket': takeBucket,
};

/** The error of a check whose store answered a hit that is not a CounterHit (a count and a resetMs). */
function malformed() {
  const error = new Error(
    'ratestore: check(key): the store answered a hit without a safe-integer count and a resetMs of 0 or more; ' +
      'a RateLimitStore must answer { count, resetMs }',
  );
  error.code = 'ERR_STORE_ANSWER';
  return error;
}

/**
 * A cached answer's reset, `end` (a performance.now() time) counted down to `now`. A sliding window's
 * reset is the end of the aligned window now current: once the one the store answered ended, the next
 * one's, a window later (as the store would answer), not 0.
 */
function resetFrom(rule, end, now) {
  if (rule.algorithm === 'sliding-window' && end <= now) {
    end += (Math.floor((now - end) / rule.windowMs) + 1) * rule.windowMs;
  }
  return Math.max(0, Math.ceil(end - now));
}

/** The release of an answer that holds no lease. */
const releasedAlready = () => Promise.resolve();

/** Each refused answer's wait in ms before the same request could pass (for wait()). */
const RETRY_MS = new WeakMap();

function remainingOf(rule, count) {
  return Math.min(rule.limit, Math.max(0, rule.limit - count));
}

// ---------------------------------------------------------------------------
// The block cache and the fallback's options

/** Entries a block cache holds by default. */
const CACHE_MAX_KEYS = 10_000;
/** Bytes a block cache's entries are counted as, at most, by default (an entry is at most ~1 KB). */
const CACHE_MAX_BYTES = 16 * 1024 * 1024;
/** Milliseconds between probes of a failing main store, by default. */
const PROBE_MS = 250;
/** Errors that say a call was wrong, not that the store is failing: they never open the circuit. */
const CALL_ERRORS = new Set(['ERR_INVALID_ARG_TYPE', 'ERR_OUT_OF_RANGE', 'ERR_COUNT_RANGE']);
/** Errors of bad input: they reject a check, failOpen or not. */
const BAD_INPUT = new Set(['ERR_INVALID_ARG_TYPE', 'ERR_OUT_OF_RANGE']);
/** Errors of a call that was never sent, whatever its `sent` says. */
const UNSENT = new Set(['ERR_CONFIG', 'ERR_AUTH', 'ERR_CLOSED']);
/**
 * Redis's answers for one key that holds other data (a key a client may choose): the store is up, so
 * they never open the circuit.
 */
const KEY_DATA = /\b(?:WRONGTYPE|NOTCOUNTER|NOTSTATE)\b/;

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

function isUnsent(error) {
  return error !== null && typeof error === 'object' && (error.sent === false || UNSENT.has(error.code));
}

function isOutage(error) {
  if (error === null || typeof error !== 'object') return true;
  if (CALL_ERRORS.has(error.code) || error.code === 'ERR_STORE_ANSWER') return false;
  return !(error.code === 'ERR_REDIS' && typeof error.message === 'string' && KEY_DATA.test(error.message));
}

function isBadInput(error) {
  return error !== null && typeof error === 'object' && BAD_INPUT.has(error.code);
}

// ---------------------------------------------------------------------------
// The limiter

function createLimiter(options) {
  const all = [
    ...COMMON_OPTIONS,
    'limits',
    'tiers',
    ...new Set([...WINDOW_OPTIONS, ...BUCKET_OPTIONS, ...LEASE_OPTIONS]),
  ];
  const {
    store,
    headers = 'draft-6',
    failOpen = false,
    blockCache,
    fallback,
    onError,
    hashTag = false,
    limits,
    tiers,
    ...single
  } = checkOptions('createLimiter', options, all);
  if (store === null || typeof store !== 'object' || typeof store.hit !== 'function') {
    throw typeError('createLimiter(options): store must be a RateLimitStore (an object with a hit method)');
  }
  checkOption('createLimiter', 'failOpen', failOpen, 'boolean');
  checkOption('createLimiter', 'onError', onError, 'function');
  checkOption('createLimiter', 'hashTag', hashTag, 'boolean');
  /**
   * The key a check's counters are kept under: the key itself, or with `hashTag`, the key as a Redis
   * hash tag (`{key}`), so that every limit's key of a check (`{key}:burst`, `{key}:daily`) lies in one
   * slot of a Redis Cluster and its limits can be one step there.
   */
  const storeKeyOf = hashTag ? (key) => `{${key}}` : (key) => key;
  const tagLength = hashTag ? 2 : 0;
  if (headers !== false && typeof headers !== 'string') {
    throw typeError(`createLimiter(options): headers must be a string or false, got ${typeof headers}`);
  }
  if (headers !== false && !STYLES.includes(headers)) {
    throw rangeError(`createLimiter(options): headers must be ${STYLES.map((s) => `'${s}'`).join(', ')} or false`);
  }
  const forms = [Object.keys(single).length > 0, limits !== undefined, tiers !== undefined].filter(Boolean).length;
  if (forms !== 1) {
    throw typeError(
      'createLimiter(options): give exactly one of: a limit (limit and windowMs, or a token bucket), limits, or tiers',
    );
  }
  const cacheBounds = readCache(blockCache, store);
  const backup = readFallback(fallback);

  /** Each set's limits as given, by tier (undefined: every key). */
  let given;
  if (tiers !== undefined) {
    if (tiers === null || typeof tiers !== 'object' || Array.isArray(tiers)) {
      throw typeError('createLimiter(options): tiers must be an object of limits by tier name');
    }
    given = new Map(Object.entries(tiers).map(([tier, set]) => [tier, [`tiers.${tier}`, set]]));
    if (given.size === 0) throw rangeError('createLimiter(options): tiers must name at least one tier');
  } else {
    given = new Map([[undefined, [limits !== undefined ? 'limits' : '', limits ?? single]]]);
  }
  const sets = new Map([...given].map(([tier, [path, value]]) => [tier, readSet(path, value, store)]));
  const tierNames = tiers === undefined ? [] : [...sets.keys()];
  const rules = [...sets.values()].flatMap((set) => set.rules);
  rules.forEach((rule, i) => {
    rule.tag = `${i} `;
    if (rule.algorithm === 'token-bucket') rule.params = `${rule.capacity}/${rule.refill}/${rule.intervalMs}`;
  });

  // The fallback's sets: the same limits, named alike, scaled, over the fallback store.
  if (backup !== undefined) {
    for (const [tier, [path, value]] of given) {
      const set = sets.get(tier);
      const list = Array.isArray(value) ? value : [value];
      const scaledList = list.map((limit, i) => scaled(limit, set.rules[i], backup.scale));
      set.fallback = readSet(`fallback (${path || 'the limit'})`, scaledList, backup.store);
    }
  }

  const cache =
    cacheBounds === undefined ? undefined : new BlockCache(cacheBounds.maxKeys, rules, cacheBounds.maxBytes);
  if (cache !== undefined) watch(store, cache);
  /** Whether the limiter tells its cache of its own calls that may change a count: the store does not. */
  const selfTold = cache !== undefined && !(store instanceof Operations);
  const counts = { checks: 0, fallbackChecks: 0 };

  /** Tells onError of a failure of the main store; a listener that throws is reported as uncaught. */
  function tell(error, fellBack) {
    if (onError === undefined) return;
    try {
      onError(error, { fallback: fellBack });
    } catch (thrown) {
      process.nextTick(() => {
        throw thrown;
      });
    }
  }

  /**
   * The circuit over the main store: closed (checks go to it) until a call fails; then open, and
   * checks go straight to the fallback while one probe at a time asks the main store, every
   * `probeMs`; the first probe it answers closes it.
   */
  const circuit = backup && {
    open: false,
    error: undefined,
    probing: false,
    nextProbe: 0,
    fail(error) {
      if (this.open) return;
      this.open = true;
      this.error = error;
      this.nextProbe = performance.now() + backup.probeMs;
    },
    probe() {
      if (this.probing || performance.now() < this.nextProbe) return;
      this.probing = true;
      let probe;
      try {
        probe = typeof store.ping === 'function' ? store.ping() : store.hit('ratestore:probe', 1_000, 0);
      } catch (error) {
        probe = Promise.reject(error);
      }
      Promise.resolve(probe).then(
        () => {
          this.probing = false;
          this.open = false;
          this.error = undefined;
        },
        (error) => {
          this.probing = false;
          this.error = error;
          this.nextProbe = performance.now() + backup.probeMs;
          tell(error, true);
        },
      );
    },
  };

  /** The set of limits a check asks for, and its cost; throws for bad arguments. */
  function request(key, how) {
    if (typeof key !== 'string') throw typeError(`check(key): key must be a string, got ${typeof key}`);
    let cost = 1;
    let tier;
    if (typeof how === 'number') cost = how;
    else if (how !== undefined) {
      checkOptions('check', how, tiers === undefined ? ['cost', 'context'] : ['cost', 'tier', 'context']);
      // Own properties only: a tier or cost inherited from a prototype is not one the caller gave.
      if (Object.hasOwn(how, 'cost') && how.cost !== undefined) cost = how.cost;
      if (Object.hasOwn(how, 'tier')) tier = how.tier;
    }
    if (typeof cost !== 'number') throw typeError(`check(key, cost): cost must be a number, got ${typeof cost}`);
    if (!(cost >= 1 && Number.isSafeInteger(cost))) {
      throw rangeError(`check(key, cost): cost must be a positive safe integer, got ${cost}`);
    }
    if (tiers !== undefined && (typeof tier !== 'string' || !sets.has(tier))) {
      throw (typeof tier === 'string' ? rangeError : typeError)(
        `check(key, options): options.tier must be one of the limiter's tiers: ${tierNames.join(', ')}`,
      );
    }
    const set = sets.get(tier);
    // Checked here, so that no store call is made and failOpen does not let a key over the bound through.
    if (key.length + tagLength + set.longestSuffix > MAX_KEY_LENGTH) {
      throw rangeError(
        `check(key): key is ${key.length} UTF-16 units long; with the limits' suffixes at most ` +
          `${MAX_KEY_LENGTH - tagLength - set.longestSuffix} are accepted`,
      );
    }
    const info = { cost, tier, context: how !== null && typeof how === 'object' ? how.context : undefined };
    return { set: resolve(set, key, info), cost, tier };
  }

  /** Answers a check: from the block cache, the fallback while the circuit is open, else the store. */
  function check(key, how) {
    let asked;
    try {
      asked = request(key, how);
    } catch (error) {
      return rejection(error);
    }
    const { set, cost, tier } = asked;
    key = storeKeyOf(key);
    // A limit asked per request may differ from the one a cached refusal proved: those go to the store.
    if (cache !== undefined && !set.perRequest) {
      const refusal = cache.refusing(set, key, cost, performance.now());
      if (refusal !== undefined) {
        cache.refusals++;
        counts.checks++;
        return Promise.resolve(cachedResult(set, refusal, tier));
      }
    }
    if (circuit !== undefined && circuit.open) {
      circuit.probe();
      return run(set.fallback, key, cost, tier, circuit.error);
    }
    return run(set, key, cost, tier, undefined);
  }

  /**
   * Runs a check's takes and answers it: on the main store (`cause` undefined), or on the fallback,
   * sent there by the main store's error `cause`. On the main store, a request whose calls all failed
   * unsent is run on the fallback instead. Rejects with the store's error (after giving back what the
   * other limits took).
   */
  async function run(set, key, cost, tier, cause) {
    const main = cause === undefined;
    const started = main && cache !== undefined ? ++cache.seq : 0;
    const sentAt = main && cache !== undefined ? performance.now() : 0;
    const taken = new Map();
    const errors = [];
    const settle = (rule, outcome) => {
      if (outcome.status === 'rejected') return errors.push(outcome.reason);
      taken.set(rule, outcome.value);
    };
    /** After a round of calls on the main store: whether the fallback counts the request instead. */
    let told = 0;
    const fellBack = () => {
      if (!main || errors.length === told) return false;
      const outage = circuit === undefined ? undefined : errors.find(isOutage);
      const whole = outage !== undefined && taken.size === 0 && errors.every(isUnsent);
      if (outage !== undefined) circuit.fail(outage);
      for (; told < errors.length; told++) tell(errors[told], whole);
      return whole;
    };
    // Every window limit at once (one round trip on Redis: the calls share a pipeline), then the
    // bucket, whose tokens cannot be given back, only once every window allowed.
    let dones = main && selfTold ? paramsTold(set, key) : undefined;
    const endTold = () => {
      if (dones !== undefined) for (const done of dones) done();
      dones = undefined;
    };
    const allAllow = () => [...taken.values()].every((answer) => answer.allowed);
    // A concurrency limit first: with no lease free, nothing else is asked.
    let proceed = true;
    /** Every limit went as one step of the store. */
    let stepped = false;
    if (set.lease !== undefined) {
      const [outcome] = await Promise.allSettled([set.lease.take(key + set.lease.suffix, set.lease, cost)]);
      settle(set.lease, outcome);
      if (fellBack()) {
        endTold();
        return run(set.fallback, key, cost, tier, errors[0]);
      }
      proceed = outcome.status === 'fulfilled' ? outcome.value.allowed : failOpen;
    }
    if (!proceed) {
      // The lease refused, or failed: the other limits are reported as configured.
    } else if (set.takeAll !== undefined) {
      // Every limit, the bucket included, as one step of the store: all take, or none does.
      try {
        const answers = await set.takeAll(key, cost);
        stepped = answers !== undefined;
        if (stepped) answers.forEach((answer, i) => taken.set(set.steps[i], answer));
        // A bucket is reported as it is without the step only once every window allowed, as when it is
        // asked last: a window's refusal is the answer, and the bucket is reported as configured.
        if (stepped && set.bucket !== undefined && set.windows.some((rule) => !taken.get(rule).allowed)) {
          taken.delete(set.bucket);
        }
      } catch (error) {
        stepped = true;
        errors.push(error);
      }
    }
    if (proceed && !stepped) {
      const outcomes = await Promise.allSettled(set.windows.map((rule) => rule.take(key + rule.suffix, rule, cost)));
      outcomes.forEach((outcome, i) => settle(set.windows[i], outcome));
    }
    if (fellBack()) {
      endTold();
      return run(set.fallback, key, cost, tier, errors[0]);
    }
    if (proceed && !stepped && set.bucket !== undefined && (failOpen || errors.length === 0) && allAllow()) {
      const [outcome] = await Promise.allSettled([set.bucket.take(key + set.bucket.suffix, set.bucket, cost)]);
      settle(set.bucket, outcome);
    }
    endTold();
    if (fellBack()) return run(set.fallback, key, cost, tier, errors[0]);
    // With the main store known to fail, what it took stays counted (on the safe side) rather than
    // waiting for a give-back that would likely fail too.
    const giveBacks = !(main && circuit !== undefined && circuit.open);
    if (errors.length > 0 && (!failOpen || errors.some(isBadInput))) {
      // check rejects: what the other limits took for this request is given back first.
      if (giveBacks) await giveBack(taken, key);
      throw errors[0];
    }
    // A limit whose store failed (failOpen) lets the request through; the others decide.
    const allowed = allAllow();
    if (!allowed && giveBacks) {
      const failures = await giveBack(taken, key);
      if (main) {
        const outage = circuit === undefined ? undefined : failures.find(isOutage);
        if (outage !== undefined) circuit.fail(outage);
        for (const error of failures) tell(error, false);
      }
      if (failures.length > 0 && !failOpen) throw failures[0];
      errors.push(...failures);
    }
    counts.checks++;
    if (!main) {
      counts.fallbackChecks++;
      const answer = result(set, taken, allowed, tier, errors[0] ?? cause);
      answer.fallback = true;
      return wakesOnRelease(answer, key);
    }
    if (cache !== undefined) {
      if (allowed || set.perRequest) cache.forget(set, key);
      else cache.remember(set, key, cost, taken, started, sentAt);
    }
    return wakesOnRelease(result(set, taken, allowed, tier, errors[0]), key);
  }

  /**
   * The wait() calls of this limiter sleeping after a refusal, by key: each a function that wakes it.
   * A lease given back wakes the key's waiters at once, so a wait behind a concurrency limit checks
   * again when a request of this process ends rather than when the soonest lease would end by itself.
   */
  const waiters = new Map();

  /** Makes an allowed answer's release() wake the key's waiters once the lease is given back. */
  function wakesOnRelease(answer, key) {
    const release = answer.release;
    if (!answer.allowed || release === undefined || release === releasedAlready) return answer;
    let released;
    answer.release = () => {
      released ??= release().finally(() => wake(key));
      return released;
    };
    return answer;
  }

  function wake(key) {
    const sleeping = waiters.get(key);
    if (sleeping === undefined) return;
    waiters.delete(key);
    for (const done of sleeping) done();
  }

  /** Sleeps `ms`, or until a lease of `key` is given back in this process, whichever comes first. */
  function sleepOrWake(key, ms) {
    return new Promise((resolve) => {
      let sleeping = waiters.get(key);
      if (sleeping === undefined) waiters.set(key, (sleeping = new Set()));
      const done = () => {
        clearTimeout(timer);
        sleeping.delete(done);
        if (sleeping.size === 0 && waiters.get(key) === sleeping) waiters.delete(key);
        resolve();
      };
      const timer = setTimeout(done, Math.max(1, ms));
      sleeping.add(done);
    });
  }

  /**
   * On a store that does not tell the cache: tells it of this check's sliding-window and bucket calls,
   * which may read a state written under other parameters as fresh; answers the functions to call once
   * they settled.
   */
  function paramsTold(set, key) {
    const dones = [];
    for (const rule of set.rules) {
      const done =
        rule.algorithm === 'sliding-window'
          ? cache.changing('sliding-params', key + rule.suffix, rule.windowMs)
          : rule.algorithm === 'token-bucket'
            ? cache.changing('bucket-params', key + rule.suffix, rule.params)
            : undefined;
      if (done !== undefined) dones.push(done);
    }
    return dones.length === 0 ? undefined : dones;
  }

  /** Gives back what the limits that allowed took, for a request that does not proceed; answers the errors. */
  async function giveBack(taken, key) {
    const failures = [];
    const backs = [...taken].filter(([, answer]) => answer.allowed && answer.giveBack !== undefined);
    await Promise.all(
      backs.map(async ([rule, answer]) => {
        // A store that does not tell the cache of its calls: the limiter tells it of its own.
        const kind = rule.algorithm === 'sliding-window' ? 'sliding' : 'fixed';
        const done = selfTold ? cache.changing(kind, key + rule.suffix) : undefined;
        try {
          const count = await answer.giveBack();
          if (count !== undefined) answer.remaining = remainingOf(rule, count);
        } catch (error) {
          failures.push(error);
        } finally {
          done?.();
        }
      }),
    );
    return failures;
  }

  /**
   * A refusal from the block cache: each limit whose entry proves it refuses, as that refusal
   * answered it, the others as the store last answered them in it; times count down.
   */
  function cachedResult(set, { proven, longest }, tier) {
    const now = performance.now();
    const taken = new Map();
    set.rules.forEach((rule, i) => {
      const entry = proven.get(rule);
      if (entry !== undefined) {
        taken.set(rule, {
          allowed: false,
          remaining: entry.remaining,
          resetMs: resetFrom(rule, entry.resetEnd, now),
          retryMs: Math.max(1, Math.ceil(entry.retryEnd - now)),
        });
        return;
      }
      const seen = longest.snapshot[i];
      if (seen !== undefined) {
        taken.set(rule, {
          allowed: true,
          remaining: seen.remaining,
          resetMs: resetFrom(rule, seen.resetEnd, now),
          retryMs: 0,
        });
      }
    });
    const answer = result(set, taken, false, tier, undefined);
    answer.cached = true;
    return answer;
  }

  function result(set, taken, allowed, tier, error) {
    const at = Date.now();
    const states = set.rules.map((rule) => {
      // A limit whose store failed (failOpen) or that was not asked (a bucket after a refusal) is
      // reported as it was configured, not as counted.
      const answer = taken.get(rule);
      const resetMs = answer?.resetMs ?? (rule.algorithm === 'token-bucket' ? 0 : rule.windowMs);
      // Every refusal carries a Retry-After of at least 1 s (NaN is not one).
      const retryAfter =
        answer === undefined || answer.allowed
          ? 0
          : Number.isFinite(answer.retryMs) && answer.retryMs > 1000
            ? Math.ceil(answer.retryMs / 1000)
            : 1;
      return {
        name: rule.name,
        algorithm: rule.algorithm,
        allowed: answer?.allowed ?? true,
        limit: rule.limit,
        remaining: answer?.remaining ?? rule.limit,
        resetMs,
        resetAt: at + resetMs,
        retryAfter,
        windowMs: rule.windowMs,
      };
    });
    // The limit the answer reports: the refusal that lasts longest, else the one closest to refusing.
    const current = allowed
      ? states.reduce((a, b) =>
          b.remaining < a.remaining || (b.remaining === a.remaining && b.resetMs > a.resetMs) ? b : a,
        )
      : states.reduce((a, b) => (!a.allowed && (b.allowed || a.retryAfter >= b.retryAfter) ? a : b));
    const answer = {
      allowed,
      limit: current.limit,
      remaining: current.remaining,
      retryAfter: current.retryAfter,
      resetAt: current.resetAt,
      resetMs: current.resetMs,
      headers: limitHeaders(headers, states, current, current.retryAfter),
      limits: states,
    };
    if (tier !== undefined) answer.tier = tier;
    if (error !== undefined) answer.error = error;
    // The request's end gives its lease back (once; a refused request, or a limiter with no concurrency
    // limit, holds none: its release() does nothing, so a handler can always call it).
    const lease = set.lease === undefined ? undefined : taken.get(set.lease);
    answer.release = allowed && lease?.release !== undefined ? lease.release : releasedAlready;
    if (!allowed) {
      // The wait before the same request could pass, in ms, for wait(): the longest refusal's.
      let wait = 0;
      for (const rule of set.rules) {
        const got = taken.get(rule);
        if (got === undefined || got.allowed) continue;
        wait = Math.max(wait, Number.isFinite(got.retryMs) && got.retryMs > 0 ? got.retryMs : 1_000);
      }
      RETRY_MS.set(answer, wait || 1_000);
    }
    return answer;
  }

  /** Every key a check of `key` counts under, in the main store. */
  function storeKeys(key) {
    const keys = rules.flatMap((rule) =>
      rule.leaseMs === undefined
        ? [key + rule.suffix]
        : Array.from({ length: rule.limit }, (_, i) => leaseKey(key + rule.suffix, i)),
    );
    return [...new Set(keys)];
  }

  /**
   * Resets `key` under every limit (and tier): its counters in the store (and in the fallback) and
   * what the block cache holds for it.
   */
  async function reset(key) {
    if (typeof key !== 'string') throw typeError(`reset(key): key must be a string, got ${typeof key}`);
    if (typeof store.reset !== 'function') {
      const error = new Error(
        'ratestore: limiter.reset(key): the store has no reset(key) (a RateLimitStore with only hit cannot ' +
          'clear a counter: a negative hit cannot say which window it lands in), so nothing was reset; ' +
          "use one of ratestore's stores, or let the window end",
      );
      error.code = 'ERR_UNSUPPORTED';
      throw error;
    }
    const keys = storeKeys(storeKeyOf(key));
    const stores = backup === undefined ? [store] : [store, backup.store];
    const calls = [];
    for (const s of stores) {
      if (typeof s.reset !== 'function') continue;
      for (const k of keys) {
        // A store ratestore made tells the cache itself; any other is told of here.
        const done =
          s === store && cache !== undefined && !(s instanceof Operations) ? cache.changing('reset', k) : undefined;
        let call;
        try {
          call = Promise.resolve(s.reset(k));
        } catch (error) {
          call = Promise.reject(error);
        }
        if (done !== undefined) call.then(done, done);
        calls.push(call);
      }
    }
    if (cache !== undefined && typeof store.reset !== 'function') {
      for (const k of keys) cache.changing('reset', k)?.();
    }
    await Promise.all(calls);
  }

  function stats() {
    return {
      checks: counts.checks,
      cacheRefusals: cache?.refusals ?? 0,
      cacheEntries: cache?.size ?? 0,
      cacheBytes: cache?.bytes ?? 0,
      cacheEvictions: cache?.evictions ?? 0,
      fallbackChecks: counts.fallbackChecks,
      fallbackActive: circuit?.open ?? false,
    };
  }

  /**
   * Resolves with the answer of a check of `key` once one is allowed, or rejects with ERR_TIMEOUT when
   * none is by `timeoutMs`. No loop of store calls: after a refusal it sleeps until the time the
   * refusal named (the store's retry time, or the window's end), or until a request of this limiter on
   * the same key gives its lease back, and checks once more; a check that could not pass before the
   * deadline is made at the deadline, once.
   */
  async function wait(key, options) {
    const { timeoutMs, cost, tier, context } = checkOptions(
      'wait',
      options,
      tiers === undefined ? ['timeoutMs', 'cost', 'context'] : ['timeoutMs', 'cost', 'tier', 'context'],
    );
    if (typeof timeoutMs !== 'number') {
      throw typeError(`wait(key, options): options.timeoutMs must be a number, got ${typeof timeoutMs}`);
    }
    if (!(Number.isSafeInteger(timeoutMs) && timeoutMs >= 0)) {
      throw rangeError(`wait(key, options): options.timeoutMs must be a safe integer of 0 or more, got ${timeoutMs}`);
    }
    const how = {};
    if (cost !== undefined) how.cost = cost;
    if (tier !== undefined) how.tier = tier;
    if (context !== undefined) how.context = context;
    // Bad arguments reject here, before any wait.
    request(key, how);
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const answer = await check(key, how);
      if (answer.allowed) return answer;
      const left = deadline - performance.now();
      if (left <= 0) {
        const error = new Error(
          `ratestore: limiter.wait(key, options): the request was not allowed within timeoutMs (${timeoutMs} ms)`,
        );
        error.code = 'ERR_TIMEOUT';
        error.sent = false;
        throw error;
      }
      await sleepOrWake(storeKeyOf(key), Math.min(RETRY_MS.get(answer) ?? 1_000, Math.ceil(left)));
    }
  }

  const limiter = { check, reset, stats, wait };
  if (tiers !== undefined) limiter.tiers = tierNames;
  return limiter;
}

module.exports = { createLimiter };
