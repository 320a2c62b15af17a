'use strict';
// The flood scenario: checks of keys already over their limit (an attack), 256 in flight, through
// createLimiter over redisStore with its block cache and without, beside rate-limiter-flexible's
// RateLimiterRedis with and without its in-memory block, and createLimiter over memoryStore. Counted
// on the server: Redis calls (scripts run, from INFO commandstats) and redis-server CPU per refused check.

const { readFileSync } = require('node:fs');
const { performance } = require('node:perf_hooks');
const ratestore = require('..');
const { startRedis } = require('./redis.js');
const { summary } = require('./stats.js');

const LIMIT = 10;
/** An hour: no window ends during a run, so every check of the flood is refused. */
const WINDOW_MS = 3_600_000;
const WIDTH = 256;
const keysOf = (n) => Array.from({ length: n }, (_, i) => `flood:ip:10.1.${i >> 8}.${i & 255}`);

/** Each flooder: `create(port, prefix)` answers { check(key) → whether refused, exhaust(keys), close() }. */
const FLOODERS = [
  {
    name: 'createLimiter over memoryStore()',
    about: 'a fixed window of 10 per hour; memoryStore keeps no block cache (its refusals are in-process already)',
    peer: true,
    async create() {
      const store = ratestore.memoryStore();
      const limiter = ratestore.createLimiter({ store, limit: LIMIT, windowMs: WINDOW_MS });
      return {
        check: async (key) => !(await limiter.check(key)).allowed,
        exhaust: (keys) =>
          Promise.all(keys.map((k) => store.consume(k, { limit: LIMIT, windowMs: WINDOW_MS, cost: LIMIT }))),
        close: () => store.close(),
      };
    },
  },
  {
    name: 'createLimiter over redisStore(), block cache (default)',
    about:
      'the same limit over redisStore: once a key is refused, its checks are refused in-process until the window ends',
    async create(port, prefix) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix });
      const limiter = ratestore.createLimiter({ store, limit: LIMIT, windowMs: WINDOW_MS });
      return { ...redisParts(store), check: async (key) => !(await limiter.check(key)).allowed };
    },
  },
  {
    name: 'createLimiter over redisStore(), blockCache: false',
    about: 'the same with the block cache off: every refused check is one consume script',
    async create(port, prefix) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix });
      const limiter = ratestore.createLimiter({ store, limit: LIMIT, windowMs: WINDOW_MS, blockCache: false });
      return { ...redisParts(store), check: async (key) => !(await limiter.check(key)).allowed };
    },
  },
  {
    name: 'rate-limiter-flexible RateLimiterRedis, inMemoryBlockOnConsumed',
    about: '`consume(key)` with `inMemoryBlockOnConsumed: 10` on an ioredis client (auto-pipelining on)',
    peer: true,
    create: (port, prefix) => flexible(port, prefix, true),
  },
  {
    name: 'rate-limiter-flexible RateLimiterRedis',
    about: 'the same without the in-memory block: every refused check is one script',
    peer: true,
    create: (port, prefix) => flexible(port, prefix, false),
  },
];

function redisParts(store) {
  return {
    exhaust: (keys) =>
      Promise.all(keys.map((k) => store.consume(k, { limit: LIMIT, windowMs: WINDOW_MS, cost: LIMIT }))),
    close: () => store.close(),
  };
}

async function flexible(port, prefix, block) {
  const Redis = require('ioredis');
  const { RateLimiterRedis } = require('rate-limiter-flexible');
  const client = new Redis({ host: '127.0.0.1', port, enableAutoPipelining: true });
  const options = { storeClient: client, points: LIMIT, duration: WINDOW_MS / 1000, keyPrefix: prefix };
  const limiter = new RateLimiterRedis(block ? { ...options, inMemoryBlockOnConsumed: LIMIT } : options);
  // Its own counters, exhausted through a limiter without the in-memory block, so that its block
  // starts empty in the measured limiter as the block cache does.
  const filler = new RateLimiterRedis(options);
  return {
    check: (key) =>
      limiter.consume(key, 1).then(
        () => false,
        (res) => {
          if (res instanceof Error) throw res;
          return true;
        },
      ),
    exhaust: (keys) => Promise.all(keys.map((k) => filler.penalty(k, LIMIT))),
    close: () => client.quit(),
  };
}

/**
 * The calls clients made so far that run a script (EVAL, EVALSHA and their _RO forms): every check
 * that reaches Redis is one. INFO commandstats also counts the commands a script runs inside it,
 * which are not calls of their own, so those are left out.
 */
async function scriptCalls(client) {
  const text = await client.info('commandstats');
  let total = 0;
  for (const [, calls] of text.matchAll(/^cmdstat_(?:eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro):calls=(\d+)/gm)) {
    total += Number(calls);
  }
  return total;
}

/** redis-server's CPU time so far (user + system), in ms: /proc's clock ticks of 10 ms. */
function serverCpuMs(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** `checks` checks over `keys`, WIDTH in flight; answers checks per second, and how many were refused. */
async function drive(flooder, keys, checks) {
  let next = 0;
  let refused = 0;
  async function worker() {
    while (next < checks) {
      const i = next++;
      if (await flooder.check(keys[i % keys.length])) refused++;
    }
  }
  const start = performance.now();
  await Promise.all(Array.from({ length: WIDTH }, worker));
  return { perSecond: checks / ((performance.now() - start) / 1000), refused };
}

/**
 * Rounds of floods, each on a fresh prefix with the keys already at their limit and a fresh
 * flooder (so its cache starts empty): each key's first refusal of the window is in every round.
 */
async function flood(size, gc) {
  const server = await startRedis();
  const Redis = require('ioredis');
  const info = new Redis({ host: '127.0.0.1', port: server.port });
  const checks = size.floodChecks;
  const tables = [];
  try {
    // One key, and many (10,000; fewer in a smoke run, whose exhausting of every key is most of its time).
    for (const count of [1, size.floodKeys]) {
      const keys = keysOf(count);
      const samples = new Map(FLOODERS.map((f) => [f.name, {}]));
      const push = (name, measure, value) => (samples.get(name)[measure] ??= []).push(value);
      for (let round = 0; round < size.redisRounds; round++) {
        for (const [i, spec] of FLOODERS.entries()) {
          const prefix = `flood:${count}:${round}:${i}:`;
          const flooder = await spec.create(server.port, prefix);
          try {
            await flooder.exhaust(keys);
            await flooder.check('warm:' + prefix);
            gc();
            const before = [await scriptCalls(info), serverCpuMs(server.pid), process.cpuUsage()];
            const started = performance.now();
            const { perSecond, refused } = await drive(flooder, keys, checks);
            const ms = performance.now() - started;
            const used = process.cpuUsage(before[2]);
            const ran = (await scriptCalls(info)) - before[0];
            if (refused !== checks)
              throw new Error(`${spec.name}: ${checks - refused} checks of the flood were allowed`);
            push(spec.name, 'refused/s', perSecond);
            push(spec.name, 'Redis calls per check', ran / checks);
            push(spec.name, 'Redis calls per key', ran / count);
            push(spec.name, 'redis-server us per check', ((serverCpuMs(server.pid) - before[1]) * 1000) / checks);
            push(spec.name, 'client cores', (used.user + used.system) / 1000 / ms);
          } finally {
            await flooder.close();
          }
        }
      }
      tables.push({
        id: count === 1 ? 'flood-1' : 'flood-keys',
        title:
          `Flood, ${count.toLocaleString('en-US')} key${count > 1 ? 's' : ''}: ${checks.toLocaleString('en-US')} ` +
          `checks of keys already over a limit of ${LIMIT} per hour, ${WIDTH} in flight, the cache empty at the start`,
        unit: 'refused checks/s; Redis calls (scripts run, INFO commandstats) and redis-server CPU per refused check',
        higherIsBetter: true,
        peerIs: 'the best peer',
        ratioOf: 'refused/s',
        columns: [
          { name: 'refused/s', range: true, unit: 'ops/s' },
          { name: 'Redis calls per check', unit: 'ratio' },
          { name: 'Redis calls per key', unit: 'ratio' },
          { name: 'redis-server us per check', unit: 'us' },
          { name: 'client cores', unit: 'cores' },
        ],
        rows: FLOODERS.map((f) => {
          const values = {};
          for (const [measure, list] of Object.entries(samples.get(f.name))) values[measure] = summary(list);
          return { store: f.name, peer: f.peer, values };
        }),
      });
    }
    return tables;
  } finally {
    info.disconnect();
    await server.stop();
  }
}

module.exports = { flood, flooders: FLOODERS };
