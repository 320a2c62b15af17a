'use strict';
// A fixed-window limiter over any RateLimitStore, for route handlers that
// have no framework limiter: one hit per check, headers on every answer.

const { checkOptions, checkOption, checkPositiveInteger, typeError, rangeError } = require('./check.js');

const OPTIONS = ['store', 'limit', 'windowMs', 'failOpen'];

function createLimiter(options) {
  const { store, limit, windowMs, failOpen = false } = checkOptions('createLimiter', options, OPTIONS);
  if (store === null || typeof store !== 'object' || typeof store.hit !== 'function') {
    throw typeError('createLimiter(options): store must be a RateLimitStore (an object with a hit method)');
  }
  checkOption('createLimiter', 'limit', limit, 'number');
  checkOption('createLimiter', 'failOpen', failOpen, 'boolean');
  if (!(limit >= 0 && Number.isSafeInteger(limit))) {
    throw rangeError(`createLimiter(options): limit must be a non-negative safe integer, got ${limit}`);
  }
  checkPositiveInteger('createLimiter', 'windowMs', windowMs);

  function answer(allowed, count, resetMs) {
    const remaining = Math.max(0, limit - count);
    const resetSeconds = Math.max(1, Math.ceil(resetMs / 1000));
    const retryAfter = allowed ? 0 : resetSeconds;
    const headers = {
      'RateLimit-Limit': String(limit),
      'RateLimit-Remaining': String(allowed ? remaining : 0),
      'RateLimit-Reset': String(resetSeconds),
    };
    if (!allowed) headers['Retry-After'] = String(retryAfter);
    return { allowed, limit, remaining: allowed ? remaining : 0, resetMs, retryAfter, headers };
  }

  async function check(key, cost = 1) {
    if (typeof cost !== 'number') throw typeError(`check(key, cost): cost must be a number, got ${typeof cost}`);
    if (!(cost >= 1 && Number.isSafeInteger(cost))) {
      throw rangeError(`check(key, cost): cost must be a positive safe integer, got ${cost}`);
    }
    let hit;
    try {
      hit = await store.hit(key, windowMs, cost);
    } catch (error) {
      if (!failOpen) throw error;
      return { ...answer(true, 0, windowMs), error };
    }
    if (hit.count <= limit) return answer(true, hit.count, hit.resetMs);
    // A refused request costs nothing: give its cost back.
    const refunded = await store.hit(key, windowMs, -cost);
    return answer(false, refunded.count, refunded.resetMs);
  }

  return { check, limit, windowMs };
}

module.exports = { createLimiter };
