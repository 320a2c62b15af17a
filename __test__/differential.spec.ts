// Every store answers as the model does: the same seeded random sequences of every operation run
// against memoryStore, a memoryStore small enough to evict, redisStore over TCP, a Redis Cluster, the
// REST transport, postgresStore and sqliteStore at once, under the real clock, each checked against the model of
// docs/algorithms.md (support/model.ts) within the slack stated in support/differential.ts.
//
// A run: the seeds of differential-seeds.json (every seed that ever diverged), then DIFF_SEEDS new
// ones (default 12) from DIFF_SEED (default: the time), DIFF_STEPS steps each (default 40); with
// DIFF_DURATION_S, new seeds until that many seconds have passed (`npm run soak`); DIFF_STORES (names, or
// their beginnings, comma-separated) runs only those stores; DIFF_LANES (default 1) seeds run at once,
// each lane on Redis servers of its own. Each step is one call, a parallel group of 2-4, a sleep or a
// wait for a window edge; a run of the kept seeds and 12 new ones makes about 6,000 calls on the eight
// stores (the closing line counts them) and takes about a minute with three lanes (two and a half with one). A divergence prints
// its seed, the store, the call, what the store answered and what the model allowed, and a reproduction shrunk by
// dropping steps; the seed is added to differential-seeds.json (outside CI) to be committed.
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createLimiter,
  expressStore,
  memoryStore,
  postgresStore,
  mysqlStore,
  redisStore,
  sqliteStore,
  universalStore,
  type RateLimitStore,
} from '../index.js';
import { Model } from './support/model.js';
import { startRedis, type RedisServer } from './support/redis.js';
import { startCluster, type Cluster } from './support/cluster.js';
import { startRest, type RestEndpoint } from './support/rest.js';
import { plainPostgres } from './support/postgres.js';
import { plainMariadb } from './support/mariadb.js';
import {
  SLACK_US,
  applyCall,
  generate,
  knownFromEnv,
  matches,
  nowUs,
  timesIn,
  touched,
  type Call,
  type Sequence,
  type StoreTraits,
} from './support/differential.js';

const SEEDS_FILE = join(process.cwd(), '__test__', 'differential-seeds.json');
const TOKEN = 'differential-token';
const known = knownFromEnv();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyStore = any;

interface Target {
  traits: StoreTraits;
  /** The clock the store's answers are checked on (epoch µs, or memoryStore's own monotonic µs). */
  clock: () => number;
  open(): { store: AnyStore; close(): Promise<void> };
  flushScripts(): Promise<void>;
}

/**
 * One lane of seeds: the lanes run their seeds at the same time (DIFF_LANES, default 1), since a
 * sequence spends most of its time in its sleeps and waits for window edges. Each lane has Redis
 * servers of its own, and each Redis target of a lane a server of its own: the suite checks the order of
 * one store's calls, and another client loading a script between two of them after SCRIPT FLUSH would
 * make the earlier one reject (README, "Calls keep their order"), which the model does not foresee.
 * postgresStore, mysqlStore and sqliteStore take a table or a file of their own per run, so the lanes
 * share their servers.
 */
interface Lane {
  redis: RedisServer;
  /** The REST endpoint's own server. */
  restRedis: RedisServer;
  cluster: Cluster;
  rest: RestEndpoint;
  targets: Target[];
}

const laneCount = Math.max(1, Math.floor(Number(process.env.DIFF_LANES ?? 1)) || 1);
let lanes: Lane[] = [];
let postgres: Awaited<ReturnType<typeof plainPostgres>>;
let mariadb: Awaited<ReturnType<typeof plainMariadb>>;

const traits = (name: string, t: Partial<StoreTraits>): StoreTraits => ({
  name,
  memory: false,
  redis: false,
  rest: false,
  evicts: false,
  ...t,
});
const prefix = () => `diff:${randomUUID()}:`;
const closing = (store: AnyStore) => ({ store, close: () => store.close() });

/** Every store under test, the Redis ones on the lane's own servers. */
function targetsOf(lane: Omit<Lane, 'targets'>): Target[] {
  const { redis, restRedis, cluster, rest } = lane;
  // DIFF_MEMORY_CLOCK=monotonic checks memoryStore on its own (monotonic) clock, so that the defects
  // behind KNOWN.memorySlidingClock do not hide the others on it.
  const memoryClock =
    process.env.DIFF_MEMORY_CLOCK === 'monotonic' ? () => Number(process.hrtime.bigint() / 1000n) : nowUs;
  let targets: Target[] = [
    {
      traits: traits('memoryStore', { memory: true }),
      clock: memoryClock,
      open: () => ({ store: memoryStore(), close: async () => {} }),
      flushScripts: async () => {},
    },
    {
      traits: traits('memoryStore (maxKeys 3)', { memory: true, evicts: true }),
      clock: memoryClock,
      open: () => ({ store: memoryStore({ maxKeys: 3 }), close: async () => {} }),
      flushScripts: async () => {},
    },
    {
      clock: nowUs,
      traits: traits('redisStore (TCP)', { redis: true }),
      open: () => closing(redisStore({ url: redis.url, prefix: prefix(), timeoutMs: 5_000 })),
      flushScripts: async () => void (await redis.cli('SCRIPT', 'FLUSH')),
    },
    {
      clock: nowUs,
      traits: traits('redisStore (cluster)', { redis: true }),
      open: () => closing(redisStore({ url: cluster.url, cluster: true, prefix: prefix(), timeoutMs: 5_000 })),
      flushScripts: async () => {
        await Promise.all(cluster.nodes.map((node) => cluster.cli(node.port, 'SCRIPT', 'FLUSH')));
      },
    },
    {
      clock: nowUs,
      traits: traits('redisStore (REST)', { redis: true, rest: true }),
      open: () => closing(redisStore({ url: rest.url, token: TOKEN, prefix: prefix(), timeoutMs: 5_000 })),
      flushScripts: async () => void (await restRedis.cli('SCRIPT', 'FLUSH')),
    },
    {
      // The database's clock, on this machine: the same epoch µs as nowUs. Tables of its own per run.
      clock: nowUs,
      traits: traits('postgresStore', {}),
      open: () =>
        closing(
          postgresStore({ url: postgres.url, table: `diff_${randomUUID().replace(/-/g, '')}`, timeoutMs: 5_000 }),
        ),
      flushScripts: async () => {},
    },
    {
      // The host's wall clock: the same epoch µs as nowUs. A file of its own per run.
      clock: nowUs,
      traits: traits('sqliteStore', {}),
      open: () => {
        const path = join(tmpdir(), `ratestore-diff-${randomUUID()}.sqlite3`);
        const store = sqliteStore({ path });
        const close = async () => {
          await store.close();
          for (const end of ['', '-wal', '-shm']) rmSync(`${path}${end}`, { force: true });
        };
        return { store, close };
      },
      flushScripts: async () => {},
    },
    {
      // The database's clock (UTC_TIMESTAMP(6)), on this machine: the same epoch µs as nowUs.
      clock: nowUs,
      traits: traits('mysqlStore', {}),
      open: () =>
        closing(
          mysqlStore({
            url: mariadb.url,
            table: `diff_${randomUUID().replace(/-/g, '').slice(0, 20)}`,
            timeoutMs: 5_000,
          }),
        ),
      flushScripts: async () => {},
    },
  ];
  // DIFF_STORES=mysqlStore,postgresStore runs only the stores whose names start with one of those.
  const only = process.env.DIFF_STORES?.split(',').filter((name) => name !== '');
  if (only !== undefined && only.length > 0) {
    targets = targets.filter((t) => only.some((name) => t.traits.name.startsWith(name)));
  }
  return targets;
}

/** A lane's servers, started at once. */
async function startLane(): Promise<Lane> {
  const [redis, restRedis, cluster] = await Promise.all([startRedis(), startRedis(), startCluster()]);
  const rest = await startRest({ redisPort: restRedis.port, token: TOKEN });
  const servers = { redis, restRedis, cluster, rest };
  return { ...servers, targets: targetsOf(servers) };
}

beforeAll(async () => {
  const started = await Promise.all([
    plainPostgres(),
    plainMariadb(),
    ...Array.from({ length: laneCount }, () => startLane()),
  ]);
  [postgres, mariadb] = started as [typeof postgres, typeof mariadb];
  lanes = started.slice(2) as Lane[];
  // A script's first use on a server retries after NOSCRIPT, which today reorders the calls behind
  // it (KNOWN.callOrder): load every script once first, so that only the flushScripts steps meet it.
  if (known.callOrder) {
    for (const target of lanes.flatMap((lane) => lane.targets).filter((t) => t.traits.redis)) {
      const { store, close } = target.open();
      await store.hit('warm', 10, 1);
      await store.consume('warm', { limit: 1, windowMs: 10 });
      await store.refund('warm', 1);
      await store.slidingWindow.increment('warm', 10, 1);
      await store.slidingWindow.consume('warm', { limit: 1, windowMs: 10 });
      await store.slidingWindow.decrement('warm', 10, 1);
      await store.tokenBucket('warm', { capacity: 1, refill: 1, intervalMs: 10 });
      await close();
    }
  }
}, 90_000);

afterAll(async () => {
  await Promise.all([
    postgres?.stop(),
    mariadb?.stop(),
    ...lanes.map(async (lane) => {
      await Promise.all([lane.rest.stop(), lane.cluster.stop()]);
      await Promise.all([lane.redis.stop(), lane.restRedis.stop()]);
    }),
  ]);
});

// -------------------------------------------------------------------------------------------------
// Running a sequence on a store

/** A store whose give-backs (refund, decrement, a negative hit) reach it `delayMs` late. */
function delayed(
  store: AnyStore,
  delayMs: number,
  hitOnly: boolean,
  stamps: number[],
  clock: () => number,
): RateLimitStore | AnyStore {
  const late =
    <A extends unknown[], R>(f: (...args: A) => Promise<R>) =>
    async (...args: A) => {
      // The takes of the check were answered before its give-back was sent.
      stamps.push(clock());
      if (delayMs > 0) await sleep(delayMs);
      return f(...args);
    };
  const hit = (key: string, windowMs: number, amount: number) =>
    amount < 0 ? late(store.hit.bind(store))(key, windowMs, amount) : store.hit(key, windowMs, amount);
  if (hitOnly) return { hit };
  if (delayMs === 0) return store;
  return {
    hit,
    consume: store.consume.bind(store),
    refund: late(store.refund.bind(store)),
    tokenBucket: store.tokenBucket.bind(store),
    reset: store.reset.bind(store),
    resetAll: store.resetAll.bind(store),
    slidingWindow: {
      increment: store.slidingWindow.increment.bind(store.slidingWindow),
      consume: store.slidingWindow.consume.bind(store.slidingWindow),
      decrement: late(store.slidingWindow.decrement.bind(store.slidingWindow)),
    },
  };
}

interface Observed {
  call: Call;
  sent: number;
  answered: number;
  answer: unknown;
}

interface Divergence {
  seed: number;
  store: string;
  step: number;
  observed: Observed;
  /** The model's answers at the ends of the call's slack, from its first candidate state. */
  model: unknown[];
}

function invoke(c: Call, store: AnyStore, limiters: AnyStore[], adapters: AnyStore[]): Promise<unknown> {
  const time = (a: { count: number; resetMs: number }) => ({ count: a.count, resetMs: a.resetMs });
  const info = (a: { totalHits: number; resetTime: Date } | undefined) =>
    a === undefined ? null : { totalHits: a.totalHits, resetMs: a.resetTime.getTime() - Date.now() };
  switch (c.op) {
    case 'hit':
      return store.hit(c.key, c.windowMs, c.amount).then(time);
    case 'consume':
      return store.consume(c.key, { limit: c.limit, windowMs: c.windowMs, cost: c.cost });
    case 'refund':
      return store.refund(c.key, c.amount).then((a: null | { count: number; resetMs: number }) => a && time(a));
    case 'sInc':
      return store.slidingWindow.increment(c.key, c.windowMs, c.amount).then(time);
    case 'sDec':
      return store.slidingWindow.decrement(c.key, c.windowMs, c.amount).then(time);
    case 'sCon':
      return store.slidingWindow
        .consume(c.key, { limit: c.limit, windowMs: c.windowMs, cost: c.cost })
        .then((a: { allowed: boolean; count: number; remaining: number; resetMs: number; retryMs: number }) => ({
          allowed: a.allowed,
          count: a.count,
          remaining: a.remaining,
          resetMs: a.resetMs,
          retryIsZero: a.retryMs === 0,
        }));
    case 'bucket':
      return store.tokenBucket(c.key, {
        capacity: c.capacity,
        refill: c.refill,
        intervalMs: c.intervalMs,
        cost: c.cost,
      });
    case 'reset':
      return store.reset(c.key).then(() => null);
    case 'resetAll':
      return store.resetAll().then(() => null);
    case 'check': {
      const limiter = limiters[c.limiter];
      const how = c.tier === '' ? c.cost : { cost: c.cost, tier: c.tier };
      return limiter.check(c.key, how).then((a: { allowed: boolean; limits: { allowed: boolean }[] }) => ({
        allowed: a.allowed,
        limits: a.limits.map((l) => l.allowed),
      }));
    }
    case 'uInc':
    case 'eInc':
      return adapters[c.adapter].increment(c.key).then(info);
    case 'uDec':
    case 'eDec':
      return adapters[c.adapter].decrement(c.key).then(() => null);
    case 'eGet':
      return adapters[c.adapter].get(c.key).then(info);
  }
}

/** Every span whose edges matter: sliding windows and bucket intervals (fixed windows' ends come from the state). */
function spansOf(seq: Sequence): number[] {
  const spans = new Set<number>();
  for (const step of seq.steps) {
    if (step.kind !== 'calls') continue;
    for (const c of step.calls) {
      if (c.op === 'sInc' || c.op === 'sDec' || c.op === 'sCon') spans.add(c.windowMs);
      if (c.op === 'bucket') spans.add(c.intervalMs);
    }
  }
  for (const l of seq.limiters) {
    for (const rules of Object.values(l.tiers)) {
      for (const rule of rules) {
        if (rule.algorithm === 'sliding-window') spans.add(rule.windowMs);
        if (rule.algorithm === 'token-bucket') spans.add(rule.intervalMs);
      }
    }
  }
  for (const a of seq.adapters) if (a.algorithm === 'sliding-window') spans.add(a.windowMs);
  return [...spans];
}

function endsOf(m: Model, intervals: number[], a: number, b: number): number[] {
  const ends: number[] = [];
  for (const s of m.fixed.values()) ends.push(s.endMs * 1000);
  for (const s of m.bucket.values()) {
    for (const span of intervals) {
      const w = span * 1000;
      const first = s.at + Math.max(1, Math.ceil((a - s.at) / w)) * w;
      for (let e = first; e <= b && e < first + 8 * w; e += w) ends.push(e);
    }
  }
  return ends;
}

interface Candidate {
  m: Model;
  /** Per key, the times the previous call of this group on it may have run at (lo..hi), and when it was sent. */
  last: Map<string, { lo: number; hi: number; sent: number }>;
}

const MAX_CANDIDATES = 48;
/** Store calls made by this run (shrinking included), for the closing line. */
let callCount = 0;

/** The candidates an observed call leaves: every state a time in its slack (and an eviction) accepts. */
function advance(seq: Sequence, traits: StoreTraits, spans: number[], cands: Candidate[], o: Observed): Candidate[] {
  const out: Candidate[] = [];
  const seen = new Map<string, Candidate>();
  const tol = (o.answered - o.sent) / 1000 + (2 * SLACK_US) / 1000 + 2;
  const orderKey = 'key' in o.call ? o.call.key : '*';
  const hit = touched(seq, o.call);
  for (const cand of cands) {
    const variants = [cand.m];
    if (traits.evicts && hit !== undefined) {
      const dropped = cand.m.clone();
      dropped.evict(hit.key, hit.algorithm);
      variants.push(dropped);
    }
    const prev = cand.last.get(orderKey) ?? (orderKey === '*' ? undefined : cand.last.get('*'));
    let a = o.sent - SLACK_US;
    let b = o.answered + SLACK_US;
    if (prev !== undefined) {
      a = Math.max(a, prev.lo);
      b = Math.min(b, prev.hi + (o.answered - prev.sent) + 50);
    }
    if (a > b) continue;
    for (const variant of variants) {
      const times = timesIn(a, b, spans, endsOf(variant, spans, a, b));
      for (const tau of times) {
        const m = variant.clone();
        const answer = applyCall(m, seq, o.call, tau);
        if (!matches(answer, o.answer, tol)) continue;
        const sig = m.signature();
        const same = seen.get(sig);
        if (same !== undefined) {
          // One state reached at several times: the next call on the key may follow any of them.
          const entry = same.last.get(orderKey)!;
          entry.lo = Math.min(entry.lo, tau);
          entry.hi = Math.max(entry.hi, tau);
          continue;
        }
        const last = new Map(cand.last);
        last.set(orderKey, { lo: tau, hi: tau, sent: o.sent });
        const next = { m, last };
        seen.set(sig, next);
        out.push(next);
      }
    }
  }
  if (out.length <= MAX_CANDIDATES) return out;
  // Too many: keep a spread of them, the earliest and latest times included.
  return Array.from(
    { length: MAX_CANDIDATES },
    (_, i) => out[Math.round((i * (out.length - 1)) / (MAX_CANDIDATES - 1))],
  );
}

/** Runs a sequence on one store; answers the first divergence from the model, if any. */
async function runOn(target: Target, seq: Sequence): Promise<Divergence | undefined> {
  const { store, close } = target.open();
  const stamps: number[] = [];
  try {
    const limiters = seq.limiters.map((spec) => {
      const over = delayed(store, spec.giveBackDelayMs, spec.over === 'hitOnly', stamps, target.clock);
      const tiers = Object.entries(spec.tiers);
      if (tiers.length === 1 && tiers[0][0] === '') {
        const rules = tiers[0][1];
        return createLimiter(rules.length === 1 ? { store: over, ...rules[0] } : { store: over, limits: rules });
      }
      return createLimiter({
        store: over,
        tiers: Object.fromEntries(tiers.map(([name, rules]) => [name, rules.length === 1 ? rules[0] : rules])),
      });
    });
    const adapters = seq.adapters.map((spec) => {
      if (spec.kind === 'universal')
        return universalStore({ windowMs: spec.windowMs, algorithm: spec.algorithm, store });
      const adapter = expressStore({ store, algorithm: spec.algorithm, prefix: 'x:' });
      adapter.init({ windowMs: spec.windowMs });
      return adapter;
    });
    const spans = spansOf(seq);
    let cands: Candidate[] = [{ m: new Model(known.slidingCeil ? 'floor' : 'ceil'), last: new Map() }];
    for (const [index, step] of seq.steps.entries()) {
      if (step.kind === 'sleep') await sleep(step.ms);
      else if (step.kind === 'edge') {
        let ms = step.windowMs - (Date.now() % step.windowMs) + step.offsetMs;
        if (ms < 0) ms += step.windowMs;
        await sleep(ms);
      } else if (step.kind === 'flushScripts') await target.flushScripts();
      else {
        const observed: Observed[] = [];
        const pending: Promise<void>[] = [];
        for (const [j, c] of step.calls.entries()) {
          callCount++;
          const o: Observed = { call: c, sent: target.clock(), answered: 0, answer: undefined };
          observed.push(o);
          pending.push(
            invoke(c, store, limiters, adapters).then(
              (answer) => {
                o.answered = target.clock();
                // A check's takes ran before its first give-back was sent (a delayed give-back would
                // otherwise let the model take at any time up to the late answer).
                if (c.op === 'check' && seq.limiters[c.limiter].giveBackDelayMs > 0) {
                  const first = stamps.filter((t) => t >= o.sent).sort((x, y) => x - y)[0];
                  if (first !== undefined) o.answered = Math.min(o.answered, first);
                }
                o.answer = answer;
              },
              (error: { code?: string; message?: string }) => {
                o.answered = target.clock();
                o.answer = { error: error.code ?? error.message };
              },
            ),
          );
          if (j === step.waitAfter) await pending[j];
        }
        await Promise.all(pending);
        for (const cand of cands) cand.last = new Map();
        for (const o of observed) {
          const next = advance(seq, target.traits, spans, cands, o);
          if (next.length === 0) {
            const m = cands[0].m;
            const model = [o.sent - SLACK_US, o.answered + SLACK_US].map((t) => applyCall(m.clone(), seq, o.call, t));
            return { seed: seq.seed, store: target.traits.name, step: index, observed: o, model };
          }
          cands = next;
        }
      }
    }
    return undefined;
  } finally {
    await close();
  }
}

/** Drops steps while the sequence still diverges on the store (each try on a fresh store), up to `tries` runs. */
async function shrink(target: Target, seq: Sequence, tries = 24): Promise<{ seq: Sequence; divergence: Divergence }> {
  let best = seq;
  let divergence = (await runOn(target, seq))!;
  if (divergence === undefined) return { seq, divergence: undefined as unknown as Divergence };
  // Nothing after the diverging step matters.
  best = { ...seq, steps: seq.steps.slice(0, divergence.step + 1) };
  let chunk = Math.max(1, Math.floor(best.steps.length / 2));
  while (tries > 0 && chunk >= 1) {
    let removed = false;
    for (let at = 0; at + chunk <= best.steps.length - 1 && tries > 0; at += chunk) {
      const steps = [...best.steps.slice(0, at), ...best.steps.slice(at + chunk)];
      const trial = { ...best, steps };
      tries--;
      const d = await runOn(target, trial);
      if (d !== undefined) {
        best = { ...trial, steps: trial.steps.slice(0, d.step + 1) };
        divergence = d;
        removed = true;
        break;
      }
    }
    if (!removed) chunk = Math.floor(chunk / 2);
  }
  return { seq: best, divergence };
}

function describeDivergence(d: Divergence, repro: Sequence): string {
  return [
    `seed ${d.seed} diverges on ${d.store} at step ${d.step}:`,
    `  call     ${JSON.stringify(d.observed.call)}`,
    `  answered ${JSON.stringify(d.observed.answer)} (round trip ${((d.observed.answered - d.observed.sent) / 1000).toFixed(2)} ms)`,
    `  model    ${JSON.stringify(d.model[0])} at sent - slack, ${JSON.stringify(d.model[1])} at answered + slack`,
    `  shrunk reproduction (${repro.steps.length} steps): ${JSON.stringify({ limiters: repro.limiters, adapters: repro.adapters, steps: repro.steps })}`,
  ].join('\n');
}

function savedSeeds(): number[] {
  try {
    return (JSON.parse(readFileSync(SEEDS_FILE, 'utf8')) as { seeds: number[] }).seeds;
  } catch {
    return [];
  }
}

function keepSeed(seed: number) {
  if (process.env.CI) return;
  const seeds = savedSeeds();
  if (seeds.includes(seed)) return;
  writeFileSync(SEEDS_FILE, JSON.stringify({ seeds: [...seeds, seed] }, null, 2) + '\n');
}

/** Runs one seed on every store of a lane at once; answers the report of each divergence, shrunk. */
async function runSeed(seed: number, steps: number, targets: Target[]): Promise<string[]> {
  const results = await Promise.all(
    targets.map(async (target) => {
      const seq = generate(seed, target.traits, known, steps);
      const d = await runOn(target, seq);
      if (d === undefined) return undefined;
      // Timing-dependent: count it only if it happens again, then shrink.
      const { seq: repro, divergence } = await shrink(target, seq);
      if (divergence === undefined) {
        return undefined;
      }
      return describeDivergence(divergence, repro);
    }),
  );
  return results.filter((r): r is string => r !== undefined);
}

const durationS = Number(process.env.DIFF_DURATION_S ?? 0);
const seedCount = Number(process.env.DIFF_SEEDS ?? 12);
const stepCount = Number(process.env.DIFF_STEPS ?? 40);
const firstSeed = Number(process.env.DIFF_SEED ?? Date.now() % 1_000_000_000);

describe('differential: every store agrees with the model', () => {
  it(
    `replays the kept seeds, then ${durationS > 0 ? `new seeds for ${durationS} s` : `${seedCount} new seeds`} from ${firstSeed}`,
    async () => {
      console.log(
        `differential: seeds from ${firstSeed} (DIFF_SEED=${firstSeed} replays them); gated: ` +
          Object.entries(known)
            .filter(([, on]) => on)
            .map(([name]) => name)
            .join(', '),
      );
      const reports: string[] = [];
      const kept = savedSeeds();
      const started = Date.now();
      let fresh = 0;
      let ran = 0;
      // The kept seeds first, then new ones; each lane takes the next seed as it finishes one.
      const nextSeed = (): number | undefined => {
        if (kept.length > 0) return kept.shift();
        const more = durationS > 0 ? Date.now() - started < durationS * 1000 : fresh < seedCount;
        return more ? firstSeed + fresh++ : undefined;
      };
      await Promise.all(
        lanes.map(async (lane) => {
          for (let seed = nextSeed(); seed !== undefined; seed = nextSeed()) {
            const found = await runSeed(seed, stepCount, lane.targets);
            ran++;
            if (found.length > 0) keepSeed(seed);
            reports.push(...found);
          }
        }),
      );
      console.log(
        `differential: ${ran} seeds on ${lanes.length} lanes, ${ran * stepCount} steps per store, ${callCount} calls on ${lanes[0].targets.length} stores, in ${Date.now() - started} ms`,
      );
      expect(reports.join('\n\n')).toBe('');
    },
    durationS > 0 ? durationS * 1000 + 600_000 : 240_000,
  );
});
