'use strict';
// Argument checks shared by every store: a bad hit is refused before any
// store is touched. Messages name the argument and its type, never a key.

/** The longest key accepted, in UTF-16 code units (1 Mi: far past any real key). */
const MAX_KEY_LENGTH = 1024 * 1024;
/**
 * The longest window (of every algorithm) and bucket refill every store accepts for a limit-aware op,
 * and a limiter for any limit: 2^52 µs (about 142 years), so that Lua's doubles stay exact and a
 * window's end (now + windowMs, in epoch ms) stays a safe integer on every store for as long as
 * ratestore runs. Past it a call is refused before any store is touched, the same on every store.
 */
const MAX_SPAN_MS = 4_503_599_627_370;

function typeName(value) {
  return value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value;
}

function typeError(message) {
  return Object.assign(new TypeError(`ratestore: ${message}`), { code: 'ERR_INVALID_ARG_TYPE' });
}

function rangeError(message) {
  return Object.assign(new RangeError(`ratestore: ${message}`), { code: 'ERR_OUT_OF_RANGE' });
}

/** The error a hit with these arguments must reject with, or undefined when they are fine. */
function invalidHit(key, windowMs, amount) {
  if (typeof key !== 'string')
    return typeError(`hit(key, windowMs, amount): key must be a string, got ${typeName(key)}`);
  if (typeof windowMs !== 'number') {
    return typeError(`hit(key, windowMs, amount): windowMs must be a number, got ${typeName(windowMs)}`);
  }
  if (typeof amount !== 'number') {
    return typeError(`hit(key, windowMs, amount): amount must be a number, got ${typeName(amount)}`);
  }
  if (key.length > MAX_KEY_LENGTH) {
    return rangeError(
      `hit(key, windowMs, amount): key is ${key.length} UTF-16 units long; at most ${MAX_KEY_LENGTH} are accepted`,
    );
  }
  if (!(windowMs >= 1 && Number.isSafeInteger(windowMs))) {
    return rangeError(`hit(key, windowMs, amount): windowMs must be a positive safe integer (ms), got ${windowMs}`);
  }
  if (!Number.isSafeInteger(amount)) {
    return rangeError(`hit(key, windowMs, amount): amount must be a safe integer, got ${amount}`);
  }
  return undefined;
}

/**
 * Checks an options object (or a nested one, named by `path`): undefined or a
 * plain object with only known keys.
 */
function checkOptions(factory, options, known, path = 'options') {
  if (options === undefined) return {};
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw typeError(`${factory}(options): ${path} must be an object, got ${typeName(options)}`);
  }
  const prefix = path === 'options' ? '' : `${path}.`;
  for (const name of Object.keys(options)) {
    if (!known.includes(name)) {
      throw typeError(
        `${factory}(options): unknown option "${prefix}${name}"; the options are ${known.map((k) => prefix + k).join(', ')}`,
      );
    }
  }
  return options;
}

function checkOption(factory, name, value, type) {
  if (value !== undefined && typeof value !== type) {
    throw typeError(`${factory}(options): ${name} must be a ${type}, got ${typeName(value)}`);
  }
}

/**
 * Checks a string option that names something (a store's name, a key prefix):
 * it must be well-formed UTF-16, since a lone surrogate could not be told
 * apart from U+FFFD once converted.
 */
function checkWellFormed(factory, name, value) {
  checkOption(factory, name, value, 'string');
  if (value !== undefined && !value.isWellFormed()) {
    throw typeError(`${factory}(options): ${name} must be a well-formed string (it holds a lone surrogate)`);
  }
}

/**
 * ERR_STORE_FULL, made without a stack trace: a full store refuses every fresh key, and a stream of them
 * (rotating client addresses) must stay cheap; the trace would only point into ratestore anyway.
 */
function storeFull(message) {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  const error = Object.assign(new Error(message), { code: 'ERR_STORE_FULL' });
  Error.stackTraceLimit = limit;
  return error;
}

const SETTLED = Promise.resolve();

/**
 * A promise that rejects with `error` one microtask from now. A promise rejected before its caller's
 * `await` attaches a handler goes through Node's unhandled-rejection tracking twice (rejected unhandled,
 * then handled); rejecting a microtask later skips both, so a stream of refusals stays cheap. A promise
 * nobody handles is still reported as an unhandled rejection.
 */
function rejection(error) {
  return SETTLED.then(() => {
    throw error;
  });
}

/** The error of a native call that failed without being able to throw (its environment is ending). */
function notAnswered() {
  return Object.assign(
    new Error('ratestore: the store could not answer this call (is the Node.js environment shutting down?)'),
    { code: 'ERR_INTERNAL' },
  );
}

/** Checks an option that must be a positive safe integer (a count or a number of ms); undefined is a TypeError. */
function checkPositiveInteger(factory, name, value) {
  if (value === undefined) throw typeError(`${factory}(options): ${name} is required (a positive safe integer)`);
  checkOption(factory, name, value, 'number');
  if (!(value >= 1 && Number.isSafeInteger(value))) {
    throw rangeError(`${factory}(options): ${name} must be a positive safe integer, got ${value}`);
  }
}

/** The error of a call on a store after its close(). */
function closedError(factory) {
  return Object.assign(new Error(`ratestore: ${factory}: the store is closed; calls after close() are refused`), {
    code: 'ERR_CLOSED',
  });
}

/** Every code a ratestore error carries. */
const ERROR_CODES = new Set([
  'ERR_INVALID_ARG_TYPE',
  'ERR_OUT_OF_RANGE',
  'ERR_COUNT_RANGE',
  'ERR_STORE_FULL',
  'ERR_STORE_NAME_CONFLICT',
  'ERR_CONFIG',
  'ERR_TIMEOUT',
  'ERR_CONNECTION',
  'ERR_AUTH',
  'ERR_REDIS',
  'ERR_POSTGRES',
  'ERR_MYSQL',
  'ERR_SQLITE',
  'ERR_CLOSED',
  'ERR_NOT_INITIALIZED',
  'ERR_INTERNAL',
  'ERR_UNSUPPORTED',
  'ERR_STORE_ANSWER',
]);

/**
 * Whether `e` is an error ratestore made: an Error with a ratestore message and one of its codes.
 * @param {unknown} e
 * @returns {e is import('../index.js').RatestoreError}
 */
function isRatestoreError(e) {
  return (
    e instanceof Error &&
    ERROR_CODES.has(/** @type {{ code?: string }} */ (e).code) &&
    e.message.startsWith('ratestore: ')
  );
}

module.exports = {
  closedError,
  isRatestoreError,
  ERROR_CODES,
  MAX_KEY_LENGTH,
  MAX_SPAN_MS,
  typeName,
  invalidHit,
  checkOptions,
  checkOption,
  checkWellFormed,
  checkPositiveInteger,
  notAnswered,
  rejection,
  storeFull,
  typeError,
  rangeError,
};
