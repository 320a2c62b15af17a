'use strict';
// The stores under test, each behind a thin adapter with ratestore's call
// shape `hit(key, windowMs, amount)`; `about` says what the adapter does, for
// RESULTS.md. Adapters only map arguments: each peer's result comes back as
// that peer returns it, so no adapter adds a promise hop.

const { readFileSync } = require('node:fs');
const { join } = require('node:path');
const ratestore = require('..');
const { noopHitForBenchmark } = require('../lib/native.js');
const { MapStore } = require('./map-store.js');

/** Every window in the benchmark: long enough that none ends during a run. */
const WINDOW_MS = 60_000;
/** Room for the stall scenario's 1,300,000 counters, so memoryStore never evicts. */
const MAX_KEYS = 2_000_000;
const REFERENCE_LUA = readFileSync(join(__dirname, 'reference.lua'), 'utf8');

/** In-process stores; `peer` marks the JS stores a ratio is taken against. */
const memoryStores = [
  {
    name: 'JS Map store',
    about: 'the RateLimitStore contract over a Map, in plain JavaScript (benchmark/map-store.js); no adapter',
    peer: true,
    create: () => new MapStore(),
  },
  {
    name: 'express-rate-limit MemoryStore',
    about:
      '`increment(key)` after `init({ windowMs })`: adds 1 in a window of that length; resolves its `{ totalHits, resetTime }`',
    peer: true,
    create() {
      const { MemoryStore } = require('express-rate-limit');
      const store = new MemoryStore();
      store.init({ windowMs: WINDOW_MS });
      return { hit: (key) => store.increment(key), close: () => store.shutdown() };
    },
  },
  {
    name: 'rate-limiter-flexible RateLimiterMemory',
    about:
      '`penalty(key, amount)` on a limiter with a 60 s duration: adds the points and resolves its RateLimiterRes, ' +
      'with no limit check, the closest call to one counter hit (`consume` also compares with a limit)',
    peer: true,
    create() {
      const { RateLimiterMemory } = require('rate-limiter-flexible');
      const limiter = new RateLimiterMemory({ points: Number.MAX_SAFE_INTEGER, duration: WINDOW_MS / 1000 });
      return { hit: (key, _windowMs, amount) => limiter.penalty(key, amount) };
    },
  },
  {
    name: 'memoryStore()',
    about: '`memoryStore({ maxKeys: 2_000_000 })`, room for the stall scenario without eviction; no adapter',
    create: () => ratestore.memoryStore({ maxKeys: MAX_KEYS }),
  },
];

/**
 * memoryStore full at `maxKeys` (the default, 1,000,000, in a full run): in the stall scenario every new key past
 * it evicts the soonest-ending counter, so the store turns over rather than grows.
 */
const turnover = {
  name: 'memoryStore(), full: turns over',
  about:
    '`memoryStore({ maxKeys })` with maxKeys the size the stall scenario starts from (the default, 1,000,000, in a ' +
    'full run): each new key past it evicts the soonest-ending counter',
  create: (maxKeys) => ratestore.memoryStore({ maxKeys }),
};

/** The floor for memoryStore: a native call that takes a hit's arguments and does nothing, answered the same way. */
class NoopStore {
  #hit;
  #io;

  constructor() {
    const { hit, io } = noopHitForBenchmark();
    this.#hit = hit;
    this.#io = io;
  }

  hit(key, windowMs, amount) {
    const io = this.#io;
    io[0] = windowMs;
    io[1] = amount;
    this.#hit(key);
    const resetMs = io[0];
    if (resetMs >= 0) return Promise.resolve({ count: io[1], resetMs });
    return Promise.reject(new Error('no answer'));
  }
}

const floor = {
  name: 'floor: no-op native call',
  about:
    "`noopHitForBenchmark().hit(key)` (a benchmark-only export): a native call that takes a hit's arguments as " +
    "memoryStore's does (the key, and the two numbers in the store's `io` array) and does nothing, answered with a " +
    'settled promise of the same object',
  create: () => new NoopStore(),
};

/** Redis stores: `create(port)` resolves a connected store with `hit` and `close`. */
const redisStores = [
  {
    name: 'ioredis EVALSHA',
    about:
      'benchmark/reference.lua (INCRBY, PTTL, PEXPIRE when no TTL) through `defineCommand` (EVALSHA, EVAL after ' +
      'NOSCRIPT), auto-pipelining on, one connection',
    peer: true,
    async create(port) {
      const client = await ioredis(port);
      return referenceStore(client);
    },
  },
  {
    name: 'node-redis 5 EVALSHA',
    about: 'the same script as a node-redis `defineScript` (EVALSHA, EVAL after NOSCRIPT), one connection',
    peer: true,
    async create(port) {
      const client = await nodeRedis(port);
      return {
        hit: (key, windowMs, amount) => client.referenceHit(`bench:node-redis:${key}`, windowMs, amount),
        close: () => client.quit(),
      };
    },
  },
  {
    name: 'Valkey GLIDE 2 invokeScript',
    about:
      'the same script as a GLIDE `Script` through `invokeScript` (EVALSHA, EVAL after NOSCRIPT, by its Rust core), ' +
      'one `GlideClient` (one multiplexed connection), its request timeout raised to 10 s for a busy machine',
    peer: true,
    async create(port) {
      const { GlideClient, Script } = require('@valkey/valkey-glide');
      const client = await GlideClient.createClient({
        addresses: [{ host: '127.0.0.1', port }],
        requestTimeout: 10_000,
      });
      const script = new Script(REFERENCE_LUA);
      return {
        hit: (key, windowMs, amount) =>
          client.invokeScript(script, { keys: [`bench:glide:${key}`], args: [String(windowMs), String(amount)] }),
        close() {
          client.close();
          script.release();
        },
      };
    },
  },
  {
    name: 'rate-limiter-flexible RateLimiterRedis',
    about:
      "`penalty(key, amount)` on an ioredis client (auto-pipelining on): the library's own script " +
      '(SET NX EX, INCRBY, PTTL) through EVALSHA, with no limit check',
    peer: true,
    async create(port) {
      const { RateLimiterRedis } = require('rate-limiter-flexible');
      const client = await ioredis(port);
      const limiter = new RateLimiterRedis({
        storeClient: client,
        points: Number.MAX_SAFE_INTEGER,
        duration: WINDOW_MS / 1000,
        keyPrefix: 'bench:rlflx',
      });
      return { hit: (key, _windowMs, amount) => limiter.penalty(key, amount), close: () => client.quit() };
    },
  },
  {
    name: 'redisStore()',
    about: "`redisStore({ url, prefix: 'bench:ratestore:' })`, connected by a first read; no adapter",
    async create(port) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix: 'bench:ratestore:' });
      await store.hit('warm-up', WINDOW_MS, 0); // connects
      return store;
    },
  },
];

/** The node-redis client of the Redis tables, with the reference script as `client.referenceHit`. */
async function nodeRedis(port) {
  const { createClient, defineScript } = require('redis');
  const referenceHit = defineScript({
    SCRIPT: REFERENCE_LUA,
    NUMBER_OF_KEYS: 1,
    parseCommand(parser, key, windowMs, amount) {
      parser.pushKey(key);
      parser.push(String(windowMs), String(amount));
    },
    transformReply: (reply) => reply,
  });
  const client = createClient({ socket: { host: '127.0.0.1', port }, scripts: { referenceHit } });
  await client.connect();
  await client.scriptLoad(REFERENCE_LUA);
  return client;
}

/**
 * Stores on a primary with one replica: `create(port)` (the primary's) resolves a connected store. What
 * answering only counts the replica has costs: `waitForReplicas` against no wait, and against `WAIT`
 * after each hit, as a JS client would write it.
 */
const replicaStores = [
  {
    name: 'node-redis 5 EVALSHA, then WAIT 1',
    about:
      'the node-redis client of the Redis tables, each hit followed by `WAIT 1 1000` sent in the same tick ' +
      '(so pipelined with it); answered once WAIT says the replica has it',
    peer: true,
    async create(port) {
      const client = await nodeRedis(port);
      return {
        async hit(key, windowMs, amount) {
          const [answer, replicas] = await Promise.all([
            client.referenceHit(`bench:node-redis-wait:${key}`, windowMs, amount),
            client.sendCommand(['WAIT', '1', '1000']),
          ]);
          if (replicas < 1) throw new Error('the replica did not confirm the hit');
          return answer;
        },
        close: () => client.quit(),
      };
    },
  },
  {
    name: 'redisStore(), no wait',
    about: '`redisStore({ url, prefix })` as in the Redis tables: answered when the primary answers',
    async create(port) {
      const store = ratestore.redisStore({ url: `redis://127.0.0.1:${port}`, prefix: 'bench:ratestore:' });
      await store.hit('warm-up', WINDOW_MS, 0);
      return store;
    },
  },
  {
    name: 'redisStore({ waitForReplicas: 1 })',
    about: '`WAIT 1 1000` once per pipeline; each hit answered once it says the replica has the pipeline',
    async create(port) {
      const store = ratestore.redisStore({
        url: `redis://127.0.0.1:${port}`,
        prefix: 'bench:ratestore-wait:',
        waitForReplicas: 1,
      });
      await store.hit('warm-up', WINDOW_MS, 0);
      return store;
    },
  },
];

/** Stores on a Redis Cluster: `create(url)` resolves a connected store, given the comma-separated seed URLs. */
const clusterStores = [
  {
    name: 'ioredis Cluster EVALSHA',
    about:
      'the same script through `defineCommand` on `new Redis.Cluster(seeds)`, auto-pipelining on, one connection ' +
      'per master',
    peer: true,
    async create(url) {
      const Redis = require('ioredis');
      const seeds = url.split(',').map((seed) => {
        const { hostname, port } = new URL(seed);
        return { host: hostname, port: Number(port) };
      });
      const client = new Redis.Cluster(seeds, { enableAutoPipelining: true, lazyConnect: true });
      await client.connect();
      return referenceStore(client);
    },
  },
  {
    name: 'redisStore({ cluster: true })',
    about: "`redisStore({ url, cluster: true, prefix: 'bench:ratestore:' })`, connected by a first read; no adapter",
    async create(url) {
      const store = ratestore.redisStore({ url, cluster: true, prefix: 'bench:ratestore:' });
      await store.hit('warm-up', WINDOW_MS, 0); // learns the slot map and connects to one master
      return store;
    },
  },
];

/**
 * Stores over Upstash's REST API: `create(endpoint)` resolves a connected store, given the test endpoint
 * (scripts/rest-endpoint.js) in front of the benchmark's redis-server.
 */
const restStores = [
  {
    name: '@upstash/redis EVALSHA',
    about:
      'the same script as an `@upstash/redis` `createScript` (EVALSHA, EVAL after NOSCRIPT), auto-pipelining on ' +
      '(one `/pipeline` request per tick), over Node.js fetch',
    peer: true,
    async create({ url, token }) {
      const { Redis } = require('@upstash/redis');
      const client = new Redis({ url, token, enableTelemetry: false, enableAutoPipelining: true });
      const script = client.createScript(REFERENCE_LUA);
      const hit = (key, windowMs, amount) => script.exec([`bench:upstash:${key}`], [String(windowMs), String(amount)]);
      await hit('warm-up', WINDOW_MS, 0);
      return { hit };
    },
  },
  {
    name: 'redisStore() over REST',
    about:
      "`redisStore({ url, token, prefix: 'bench:ratestore-rest:' })` with the endpoint's http:// URL, connected by " +
      'a first read; no adapter',
    async create({ url, token }) {
      const store = ratestore.redisStore({ url, token, prefix: 'bench:ratestore-rest:' });
      await store.hit('warm-up', WINDOW_MS, 0);
      return store;
    },
  },
];

/** Seed 000's table of fixed-window counters, under `table`'s name. */
const seedTable = (table) => `CREATE TABLE IF NOT EXISTS ${table} (
  key      text        PRIMARY KEY,
  total    bigint      NOT NULL,
  reset_at timestamptz NOT NULL
)`;

/** Seed 000's upsert, word for word (its table's name aside): opens, adds to or restarts a window. */
const seedHit = (table) => `
  INSERT INTO ${table} AS c (key, total, reset_at)
  VALUES ($1, $2, now() + make_interval(secs => $3::float8 / 1000))
  ON CONFLICT (key) DO UPDATE SET
    total    = CASE WHEN c.reset_at > now() THEN c.total + EXCLUDED.total ELSE EXCLUDED.total END,
    reset_at = CASE WHEN c.reset_at > now() THEN c.reset_at ELSE EXCLUDED.reset_at END
  RETURNING total, ceil(extract(epoch FROM reset_at - now()) * 1000) AS reset_ms`;

/**
 * PostgreSQL stores: `create(url)` resolves a connected store, its table made, with `hit` and `close`;
 * `table` names its table, in seed 000's layout unless `prefill` is the SQL that puts a row of each key of
 * `$1` (a text[]) in it: the scenario puts an ended window of each benchmark key in every table, so that
 * each measured hit updates a row rather than inserting the first ones.
 */
const postgresStores = [
  {
    name: "pg Pool, seed 000's upsert",
    about:
      "seed 000's sketch as it is: its upsert (`INSERT ... ON CONFLICT (key) DO UPDATE ... RETURNING`) through " +
      '`pool.query(text, [key, amount, windowMs])` of a `pg` Pool (its default size, up to 10 connections, kept open ' +
      "between rounds with `idleTimeoutMillis: 0`; an unnamed statement each time) on the seed's table " +
      '`askdare_counters`, the count and resetMs made numbers',
    peer: true,
    table: 'askdare_counters',
    async create(url) {
      const { Pool } = require('pg');
      const pool = new Pool({ connectionString: url, idleTimeoutMillis: 0 });
      await pool.query(seedTable('askdare_counters'));
      const text = seedHit('askdare_counters');
      return {
        async hit(key, windowMs, amount) {
          const { rows } = await pool.query(text, [key, amount, windowMs]);
          const row = rows[0];
          if (!row) throw new Error('postgresStore: the counter upsert returned no row.');
          return { count: Number(row.total), resetMs: Number(row.reset_ms) };
        },
        close: () => pool.end(),
      };
    },
  },
  {
    name: 'rate-limiter-flexible RateLimiterPostgres',
    about:
      "`penalty(key, amount)` on the same kind of `pg` Pool: the library's own upsert (a named prepared " +
      'statement, its expiry computed in JS) on its own table `bench_rlflx`, made before the rounds (the ' +
      "constructor's callback), with no limit check, as RateLimiterRedis's row",
    peer: true,
    table: 'bench_rlflx',
    prefill:
      "INSERT INTO bench_rlflx (key, points, expire) SELECT 'rlflx:' || k, 0, " +
      '(extract(epoch FROM now()) * 1000)::bigint FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING',
    async create(url) {
      const { Pool } = require('pg');
      const { RateLimiterPostgres } = require('rate-limiter-flexible');
      const pool = new Pool({ connectionString: url, idleTimeoutMillis: 0 });
      const limiter = await new Promise((resolve, reject) => {
        const made = new RateLimiterPostgres(
          {
            storeClient: pool,
            tableName: 'bench_rlflx',
            points: Number.MAX_SAFE_INTEGER,
            duration: WINDOW_MS / 1000,
          },
          (error) => (error ? reject(error) : resolve(made)),
        );
      });
      return { hit: (key, _windowMs, amount) => limiter.penalty(key, amount), close: () => pool.end() };
    },
  },
  {
    name: "postgres (postgres.js), seed 000's upsert",
    about:
      "seed 000's upsert as a tagged template of the `postgres` package (its defaults: prepared statements, " +
      "queries pipelined on up to 10 connections) on a table of its own in the seed's layout, `bench_postgresjs`",
    peer: true,
    table: 'bench_postgresjs',
    async create(url) {
      // Bun's require of this ES module answers the module, not its default export.
      const imported = require('postgres');
      const postgres = imported.default ?? imported;
      const sql = postgres(url, { max: 10, onnotice: () => {} });
      await sql.unsafe(seedTable('bench_postgresjs'));
      const t = sql('bench_postgresjs');
      return {
        async hit(key, windowMs, amount) {
          const [row] = await sql`
            INSERT INTO ${t} AS c (key, total, reset_at)
            VALUES (${key}, ${amount}, now() + make_interval(secs => ${windowMs}::float8 / 1000))
            ON CONFLICT (key) DO UPDATE SET
              total    = CASE WHEN c.reset_at > now() THEN c.total + EXCLUDED.total ELSE EXCLUDED.total END,
              reset_at = CASE WHEN c.reset_at > now() THEN c.reset_at ELSE EXCLUDED.reset_at END
            RETURNING total, ceil(extract(epoch FROM reset_at - now()) * 1000) AS reset_ms`;
          if (!row) throw new Error('postgresStore: the counter upsert returned no row.');
          return { count: Number(row.total), resetMs: Number(row.reset_ms) };
        },
        close: () => sql.end({ timeout: 5 }),
      };
    },
  },
  {
    name: 'postgresStore()',
    about:
      "`postgresStore({ url, table: 'bench_ratestore' })` (one connection; a hit alone is one call of its " +
      'fixed-window function, the hits made while a statement is out go together as one statement), its tables ' +
      'made by `connect()` before the rounds; no adapter',
    table: 'bench_ratestore',
    async create(url) {
      const store = ratestore.postgresStore({ url, table: 'bench_ratestore' });
      await store.connect();
      return store;
    },
  },
];

/** An ioredis client (single or cluster) running the reference script, as a store. */
function referenceStore(client) {
  client.defineCommand('referenceHit', { numberOfKeys: 1, lua: REFERENCE_LUA });
  return {
    hit: (key, windowMs, amount) => client.referenceHit(`bench:ioredis:${key}`, windowMs, amount),
    close: () => client.quit(),
  };
}

/** An ioredis client with auto-pipelining (its fastest setting for many hits in flight), connected. */
async function ioredis(port) {
  const Redis = require('ioredis');
  const client = new Redis({ host: '127.0.0.1', port, enableAutoPipelining: true, lazyConnect: true });
  await client.connect();
  return client;
}

module.exports = {
  WINDOW_MS,
  MAX_KEYS,
  REFERENCE_LUA,
  memoryStores,
  turnover,
  floor,
  redisStores,
  replicaStores,
  clusterStores,
  restStores,
  postgresStores,
  seedTable,
  seedHit,
};
