'use strict';
// The store ratestore replaces: the RateLimitStore contract written in plain
// JavaScript over a Map, as a careful developer would write it (the same
// argument checks, a monotonic clock, ended windows swept once a minute by an
// unref'd timer).

const { performance } = require('node:perf_hooks');
const { invalidHit } = require('../lib/check.js');

class MapStore {
  #counters = new Map();
  #sweeper;

  constructor() {
    this.#sweeper = setInterval(() => this.#sweep(), 60_000);
    this.#sweeper.unref();
  }

  get shared() {
    return false;
  }

  async hit(key, windowMs, amount) {
    const invalid = invalidHit(key, windowMs, amount);
    if (invalid !== undefined) throw invalid;
    const now = performance.now();
    let counter = this.#counters.get(key);
    if (counter !== undefined && counter.endsAt - now < 1) counter = undefined;
    if (counter === undefined) {
      if (amount === 0) return { count: 0, resetMs: windowMs };
      counter = { count: 0, endsAt: now + windowMs };
      this.#counters.set(key, counter);
    }
    const count = counter.count + amount;
    if (!Number.isSafeInteger(count)) throw new RangeError('the count would leave the safe-integer range');
    counter.count = count;
    return { count, resetMs: Math.ceil(counter.endsAt - now) };
  }

  #sweep() {
    const now = performance.now();
    for (const [key, counter] of this.#counters) if (counter.endsAt - now < 1) this.#counters.delete(key);
  }
}

module.exports = { MapStore };
