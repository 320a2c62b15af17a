'use strict';
// Calls that may lower a count, told to the limiters' block caches over the same store in this
// process: a refund, a decrement, a hit of a negative amount, a reset, a resetAll, and a sliding
// window or token bucket call with parameters other than a cached limit's (a state written under
// other parameters can be read as fresh). A cache forgets what such a call may have changed, and
// keeps no refusal that ran at the same time as one.

const WATCHERS = Symbol('ratestore.watchers');

/**
 * Registers `cache` (held weakly) to be told of `store`'s calls. Caches that were collected are
 * pruned as more register (a limiter made per request over one store leaks nothing).
 */
function watch(store, cache) {
  if (store === null || typeof store !== 'object') return;
  let list = store[WATCHERS];
  if (list === undefined) {
    list = new Set();
    try {
      Object.defineProperty(store, WATCHERS, { value: list });
    } catch {
      return;
    }
  }
  if (list.size >= (pruneAt.get(list) ?? 64)) {
    for (const ref of list) if (ref.deref() === undefined) list.delete(ref);
    pruneAt.set(list, Math.max(64, 2 * list.size));
  }
  list.add(new WeakRef(cache));
}

/** Each watcher list's size at which it is next pruned. */
const pruneAt = new WeakMap();

/**
 * Tells the caches watching `store` that a call is about to run, then makes it (`call()`); answers its
 * promise, through which they learn it settled. `kind`: 'fixed' or 'sliding' (a call that may lower
 * that algorithm's count), 'reset', 'all' (resetAll), 'sliding-params' or 'bucket-params' (a call
 * under the parameters `params`). The answer settles as the call does, one tick later, so that a
 * rejection nobody handles is still reported.
 */
function told(store, kind, key, params, call) {
  const list = store[WATCHERS];
  if (list === undefined) return call();
  let dones;
  for (const ref of list) {
    const cache = ref.deref();
    if (cache === undefined) {
      list.delete(ref);
      continue;
    }
    const done = cache.changing(kind, key, params);
    if (done !== undefined) (dones ??= []).push(done);
  }
  const promise = call();
  if (dones === undefined) return promise;
  const end = () => {
    for (const done of dones) done();
  };
  return promise.then(
    (value) => {
      end();
      return value;
    },
    (error) => {
      end();
      throw error;
    },
  );
}

module.exports = { WATCHERS, watch, told };
