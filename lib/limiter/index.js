'use strict';
// createLimiter: the limits of a request (one, several, or those of its tier) checked against a store,
// with the answer's headers, a block cache of refusals, and a fallback store behind a circuit. Its
// parts: options.js (the options read), takes.js (one limit against the store), breaker.js (the
// circuit), answer.js (what a check answers).

const { checkOptions, checkOption, typeError, rangeError, rejection, MAX_KEY_LENGTH } = require('../check.js');
const { STYLES } = require('../headers.js');
const { BlockCache } = require('../block-cache.js');
const { watch } = require('../watch.js');
const { Operations } = require('../ops.js');
const {
  WINDOW_OPTIONS,
  BUCKET_OPTIONS,
  LEASE_OPTIONS,
  COMMON_OPTIONS,
  readSet,
  readCache,
  readFallback,
  scaled,
  resolve,
} = require('./options.js');
const { leaseKey, remainingOf } = require('./takes.js');
const { Breaker, isUnsent, isOutage, isBadInput } = require('./breaker.js');
const { result, cachedResult, releasedAlready, RETRY_MS } = require('./answer.js');

/**
 * @template {string} Tier
 * @overload
 * @param {import('../../index.js').TieredLimiterOptions<Tier>} options
 * @returns {import('../../index.js').TieredLimiter<Tier>}
 */
/**
 * @overload
 * @param {import('../../index.js').LimiterOptions} options
 * @returns {import('../../index.js').Limiter}
 */
/**
 * A limiter over a store: one limit, several limits taken together, or tiers of them.
 * @param {any} options
 */
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

  /** The circuit over the main store, with a fallback (breaker.js). */
  const circuit = backup && new Breaker(backup.probeMs);

  /** Asks the main store once, when a probe is due: its answer closes the circuit. */
  function probe() {
    if (!circuit.probeDue(performance.now())) return;
    let call;
    try {
      call = typeof store.ping === 'function' ? store.ping() : store.hit('ratestore:probe', 1_000, 0);
    } catch (error) {
      call = Promise.reject(error);
    }
    Promise.resolve(call).then(
      () => circuit.probed(performance.now(), undefined),
      (error) => {
        circuit.probed(performance.now(), error);
        tell(error, true);
      },
    );
  }

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
        return Promise.resolve(cachedResult(headers, set, refusal, tier, performance.now()));
      }
    }
    if (circuit !== undefined && circuit.open) {
      probe();
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
      if (outage !== undefined) circuit.fail(outage, performance.now());
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
        if (outage !== undefined) circuit.fail(outage, performance.now());
        for (const error of failures) tell(error, false);
      }
      if (failures.length > 0 && !failOpen) throw failures[0];
      errors.push(...failures);
    }
    counts.checks++;
    if (!main) {
      counts.fallbackChecks++;
      const answer = result(headers, set, taken, allowed, tier, errors[0] ?? cause);
      answer.fallback = true;
      return wakesOnRelease(answer, key);
    }
    if (cache !== undefined) {
      if (allowed || set.perRequest) cache.forget(set, key);
      else cache.remember(set, key, cost, taken, started, sentAt);
    }
    return wakesOnRelease(result(headers, set, taken, allowed, tier, errors[0]), key);
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
    return new Promise(
      /** @param {(value?: unknown) => void} resolve */ (resolve) => {
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
      },
    );
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
      throw Object.assign(error, { code: 'ERR_UNSUPPORTED' });
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
        throw Object.assign(error, { code: 'ERR_TIMEOUT', sent: false });
      }
      await sleepOrWake(storeKeyOf(key), Math.min(RETRY_MS.get(answer) ?? 1_000, Math.ceil(left)));
    }
  }

  const limiter = { check, reset, stats, wait };
  if (tiers !== undefined) limiter.tiers = tierNames;
  return limiter;
}

module.exports = { createLimiter };
