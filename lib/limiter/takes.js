'use strict';
// One limit against the store. A take answers { allowed, count?, remaining, resetMs, retryMs } and,
// when it took something that can be given back, giveBack(): a promise of the new remaining count.
// On ratestore's own stores each limit is one atomic, limit-aware call, and what a request took is
// given back only to the window it took it from; on any other RateLimitStore a fixed window is a hit,
// never given back.

const { OP, TAKES, MAX_TAKES } = require('../ops.js');

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
  return Object.assign(
    new Error(
      'ratestore: check(key): the store answered a hit without a safe-integer count and a resetMs of 0 or more; ' +
        'a RateLimitStore must answer { count, resetMs }',
    ),
    { code: 'ERR_STORE_ANSWER' },
  );
}

function remainingOf(rule, count) {
  return Math.min(rule.limit, Math.max(0, rule.limit - count));
}

module.exports = { supports, TAKES_BY_ALGORITHM, takeAllOf, leaseKey, malformed, remainingOf };
