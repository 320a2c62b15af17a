'use strict';
// The consume scenario: a limit-aware consume per request (the call a limiter
// makes), in memory and on Redis, beside the JS peers doing the same. The
// limit is far above the traffic, so every call takes its cost: the cost of
// the check and the write, not of a refusal.

const { performance } = require('node:perf_hooks');
const ratestore = require('..');
const { WINDOW_MS } = require('./stores.js');

const LIMIT = Number.MAX_SAFE_INTEGER;
const consume = { limit: LIMIT, windowMs: WINDOW_MS };

/**
 * A sliding window in plain JavaScript over a Map, as seed 004 describes it (aligned windows, the
 * previous one weighted by its share still inside), with a limit check.
 */
class MapSlidingWindow {
  #windows = new Map();

  async consume(key, limit, windowMs, cost) {
    const now = performance.now();
    const start = now - (now % windowMs);
    let w = this.#windows.get(key);
    if (w === undefined || w.start + 2 * windowMs <= start) w = { start, previous: 0, current: 0 };
    else if (w.start + windowMs <= start) w = { start, previous: w.current, current: 0 };
    const estimate = Math.ceil((w.previous * (windowMs - (now - start))) / windowMs) + w.current;
    if (estimate + cost > limit) return { allowed: false, count: estimate };
    w.current += cost;
    this.#windows.set(key, w);
    return { allowed: true, count: estimate + cost };
  }
}

const memoryConsumers = [
  {
    name: 'rate-limiter-flexible RateLimiterMemory consume',
    about: '`consume(key, 1)` on a fixed-window limiter of 60 s',
    peer: true,
    create() {
      const { RateLimiterMemory } = require('rate-limiter-flexible');
      const limiter = new RateLimiterMemory({ points: LIMIT, duration: WINDOW_MS / 1000 });
      return { hit: (key) => limiter.consume(key, 1) };
    },
  },
  {
    name: 'JS Map sliding window consume',
    about: 'a sliding window over a Map in plain JavaScript (benchmark/consume.js), with a limit check',
    peer: true,
    create() {
      const windows = new MapSlidingWindow();
      return { hit: (key) => windows.consume(key, LIMIT, WINDOW_MS, 1) };
    },
  },
  {
    name: 'memoryStore().consume',
    about: 'the fixed-window `consume(key, { limit, windowMs })`',
    create() {
      const store = ratestore.memoryStore({ maxKeys: 2_000_000 });
      return { hit: (key) => store.consume(key, consume) };
    },
  },
  {
    name: 'memoryStore().slidingWindow.consume',
    about: 'the sliding window `slidingWindow.consume(key, { limit, windowMs })`',
    create() {
      const store = ratestore.memoryStore({ maxKeys: 2_000_000 });
      return { hit: (key) => store.slidingWindow.consume(key, consume) };
    },
  },
];

const redisConsumers = [
  {
    name: 'rate-limiter-flexible RateLimiterRedis consume',
    about: '`consume(key, 1)` on an ioredis client (auto-pipelining on), the library’s own script',
    peer: true,
    async create(port) {
      const Redis = require('ioredis');
      const { RateLimiterRedis } = require('rate-limiter-flexible');
      const client = new Redis({ host: '127.0.0.1', port, enableAutoPipelining: true });
      const limiter = new RateLimiterRedis({
        storeClient: client,
        points: LIMIT,
        duration: WINDOW_MS / 1000,
        keyPrefix: 'bench:consume:rlflx',
      });
      await limiter.consume('warm', 1);
      return { hit: (key) => limiter.consume(key, 1), close: () => client.quit() };
    },
  },
  {
    name: 'redisStore().consume',
    about: 'the fixed-window `consume` script, one round trip',
    async create(port) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix: 'bench:consume:ratestore:' });
      await store.consume('warm', consume);
      return { hit: (key) => store.consume(key, consume), close: () => store.close() };
    },
  },
  {
    name: 'redisStore().slidingWindow.consume',
    about: 'the sliding-window script on the server’s clock, one round trip',
    async create(port) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix: 'bench:consume:sliding:' });
      await store.slidingWindow.consume('warm', consume);
      return { hit: (key) => store.slidingWindow.consume(key, consume), close: () => store.close() };
    },
  },
];

module.exports = { memoryConsumers, redisConsumers };
