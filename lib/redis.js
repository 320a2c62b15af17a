'use strict';
// redisStore: the JS face of the native Redis store. A hit is checked here,
// queued to the native I/O thread by a synchronous call, and its promise is
// settled when its batch of results comes back (see NAPI costs in the README).

const native = require('./native.js');
const { invalidHit, checkOptions, checkOption, rangeError } = require('./check.js');

const OPTIONS = ['url', 'token', 'prefix', 'timeoutMs', 'tls'];
// Hit ids stay small integers, which Map keys handle fastest.
const ID_MASK = 0x3fffffff;

class RedisStore {
  #native;
  #results;
  /** id → { resolve, reject } of each hit in flight. */
  #pending = new Map();
  #nextId = 0;
  #opened = false;
  /** Whether the native side is holding the process open for hits in flight. */
  #held = false;
  /** close() promises waiting for the hits in flight. */
  #drained = [];
  /** Called with each batch of results. The native side holds it only weakly while idle, so it lives here. */
  #onBatch = (n, errors) => this.#settle(n, errors);

  constructor(options) {
    const { url, token, prefix, timeoutMs, tls } = checkOptions('redisStore', options, OPTIONS);
    checkOption('redisStore', 'url', url, 'string');
    checkOption('redisStore', 'token', token, 'string');
    checkOption('redisStore', 'prefix', prefix, 'string');
    checkOption('redisStore', 'timeoutMs', timeoutMs, 'number');
    const { ca } = checkOptions('redisStore', tls, ['ca'], 'tls');
    checkOption('redisStore', 'tls.ca', ca, 'string');
    if (timeoutMs !== undefined && !(timeoutMs >= 1 && Number.isSafeInteger(timeoutMs))) {
      throw rangeError(`redisStore(options): timeoutMs must be a positive safe integer (ms), got ${timeoutMs}`);
    }
    this.#native = native.redisStore(url, token, prefix, timeoutMs, ca, this.#onBatch);
    this.#results = this.#native.results;
  }

  /** Always true: every instance that uses the same Redis sees the same counters. */
  get shared() {
    return true;
  }

  hit(key, windowMs, amount) {
    const invalid = invalidHit(key, windowMs, amount);
    if (invalid !== undefined) return Promise.reject(invalid);
    const store = this.#native;
    const id = (this.#nextId = (this.#nextId + 1) & ID_MASK);
    try {
      if (!this.#opened) {
        // The environment is read on the first hit, never at import or construction.
        this.#opened = true;
        store.open(process.env);
      }
      store.send(id, key, windowMs, amount);
    } catch (error) {
      return Promise.reject(error);
    }
    if (!this.#held) {
      this.#held = true;
      store.ref();
    }
    return new Promise((resolve, reject) => this.#pending.set(id, { resolve, reject }));
  }

  /** Refuses later hits (ERR_CLOSED) and ends the connection; resolves once the hits in flight have settled. */
  close() {
    this.#native.close();
    if (this.#pending.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }

  #settle(n, errors) {
    const results = this.#results;
    const pending = this.#pending;
    for (let i = 0; i < 3 * n; i += 3) {
      const waiter = pending.get(results[i]);
      if (waiter === undefined) continue;
      pending.delete(results[i]);
      waiter.resolve({ count: results[i + 1], resetMs: results[i + 2] });
    }
    if (errors !== undefined) {
      for (let i = 0; i < errors.length; i += 2) {
        const waiter = pending.get(errors[i]);
        if (waiter === undefined) continue;
        pending.delete(errors[i]);
        waiter.reject(errors[i + 1]);
      }
    }
    if (pending.size === 0 && this.#held) {
      this.#held = false;
      this.#native.unref();
      for (const resolve of this.#drained.splice(0)) resolve();
    }
  }
}

function redisStore(options) {
  return new RedisStore(options);
}

module.exports = { redisStore, RedisStore };
