'use strict';
// The circuit over a limiter's main store when it has a fallback, and what a store's error says about
// the store. A state machine with no clock and no I/O of its own: the limiter passes `now` in
// (performance.now() milliseconds) and makes the probe's call itself.

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

/** Whether a call that failed with `error` was never sent (so it counted nothing). */
function isUnsent(error) {
  return error !== null && typeof error === 'object' && (error.sent === false || UNSENT.has(error.code));
}

/** Whether `error` says the store is failing (it opens the circuit), not that the call was wrong. */
function isOutage(error) {
  if (error === null || typeof error !== 'object') return true;
  if (CALL_ERRORS.has(error.code) || error.code === 'ERR_STORE_ANSWER') return false;
  return !(error.code === 'ERR_REDIS' && typeof error.message === 'string' && KEY_DATA.test(error.message));
}

/** Whether `error` is bad input, which rejects a check whatever failOpen says. */
function isBadInput(error) {
  return error !== null && typeof error === 'object' && BAD_INPUT.has(error.code);
}

/**
 * Closed (checks go to the main store) until a call fails with an outage; then open, and checks go
 * straight to the fallback while one probe at a time asks the main store, every `probeMs`; the first
 * probe it answers closes it.
 */
class Breaker {
  /** @param {number} probeMs */
  constructor(probeMs) {
    this.probeMs = probeMs;
    /** Whether checks go to the fallback. */
    this.open = false;
    /** The error that opened the circuit, or the last probe's. */
    this.error = undefined;
    this.probing = false;
    this.nextProbe = 0;
  }

  /** A call on the main store failed with an outage at `now`: opens the circuit (once). */
  fail(error, now) {
    if (this.open) return;
    this.open = true;
    this.error = error;
    this.nextProbe = now + this.probeMs;
  }

  /** Whether a probe is due at `now`; if so it is under way until probed() is called. */
  probeDue(now) {
    if (!this.open || this.probing || now < this.nextProbe) return false;
    this.probing = true;
    return true;
  }

  /** The probe under way ended at `now`: answered (`error` undefined) closes the circuit; failed, the next is due `probeMs` later. */
  probed(now, error) {
    this.probing = false;
    if (error === undefined) {
      this.open = false;
      this.error = undefined;
    } else {
      this.error = error;
      this.nextProbe = now + this.probeMs;
    }
  }
}

module.exports = { Breaker, isUnsent, isOutage, isBadInput };
