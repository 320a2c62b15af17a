'use strict';
// A check's answer: every limit's state as the store (or the block cache) answered it, the limit the
// answer reports, its headers, its wait for wait(), and the release of the lease it holds.

const { limitHeaders } = require('../headers.js');

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

/**
 * A refusal from the block cache: each limit whose entry proves it refuses, as that refusal
 * answered it, the others as the store last answered them in it; times count down.
 */
function cachedResult(headers, set, { proven, longest }, tier, now) {
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
  const answer = result(headers, set, taken, false, tier, undefined);
  answer.cached = true;
  return answer;
}

/** A check's answer: each limit's state, the one reported, the headers in style `headers`. */
function result(headers, set, taken, allowed, tier, error) {
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

module.exports = { result, cachedResult, releasedAlready, RETRY_MS };
