// The differential runner: seeded random sequences of every operation, run against real stores under
// the real clock and checked against the model (support/model.ts).
//
// Clock and slack. Each call is timed on this process's clock (epoch µs: performance.timeOrigin +
// performance.now(), the wall clock read once then advanced monotonically) when it is sent and when it
// is answered. The store ran it at some moment in between, on its own clock, which may differ from this
// one by a constant offset of at most SLACK_US. So an answer must equal the model's answer at SOME time
// τ in [sent - SLACK_US, answered + SLACK_US]; calls on one key in one parallel group take times in the
// order they were made, no further apart than the first was sent and the second answered (the offset is
// common to both). The model is kept as the set of states every accepted choice of times leads to
// (candidates), so a window the store opened is the model's window opened at a time it could have.
// Counts, allowed and remaining must be equal; resetMs and retryMs within the call's round trip + 2
// slacks + 2 ms.
import { performance } from 'node:perf_hooks';
import { Model, US } from './model.js';

export const SLACK_US = 3_000;

// -------------------------------------------------------------------------------------------------
// The cases the current code cannot pass yet, one name per defect. Each true entry leaves those
// operation kinds out of the generated sequences. Once the fix for an entry is merged, set it to false
// (or delete it); DIFF_KNOWN=none runs every kind whatever this says (DIFF_KNOWN=a,b keeps only a and b).
export const KNOWN_DEFAULT = {
  /** memoryStore aligns sliding windows on its monotonic clock, not on the epoch (1). */
  memorySlidingClock: false,
  /** The sliding estimate rounds the previous window's share down, not up (2); while true the model rounds down too. */
  slidingCeil: false,
  /** The limiter's give-backs name no window (delayed past an edge they take another window's count), and over a hit-only store it gives back (3). */
  giveBackWindow: false,
  /**
   * Calls retried after NOSCRIPT, and REST calls behind one still in flight, ran out of order (4); after
   * SCRIPT FLUSH, a script's first use on a connection ran before an older call's retry. While true, REST
   * runs a parallel group one call at a time.
   */
  callOrder: false,
  /** redisStore's resetAll runs out of order with the store's other calls (5). */
  resetAllOrder: false,
  /**
   * A sliding state read with another windowMs (6): memoryStore counted it in full; a read that found
   * nothing under its windowMs dropped a state still counting under its own, and the model kept states
   * past their end. While true, a sequence uses one sliding windowMs per key.
   */
  slidingWindowMs: false,
  /** A full memoryStore evicts half of a sliding state (7). */
  memoryEviction: false,
  /** memoryStore's fixed windows count about 1 ms less than windowMs (8: windowMs 1 and 2 on memory). */
  memoryShortWindow: false,
};
export type Known = typeof KNOWN_DEFAULT;

export function knownFromEnv(env = process.env.DIFF_KNOWN): Known {
  if (env === undefined) return { ...KNOWN_DEFAULT };
  const on = new Set(env === 'none' ? [] : env.split(','));
  const known = { ...KNOWN_DEFAULT };
  for (const name of Object.keys(known) as (keyof Known)[]) known[name] = on.has(name);
  return known;
}

// -------------------------------------------------------------------------------------------------
// A small seeded PRNG (mulberry32).

export function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <T>(list: readonly T[]): T => list[Math.floor(next() * list.length)],
    chance: (p: number) => next() < p,
  };
}

// -------------------------------------------------------------------------------------------------
// Sequences

type Rule =
  | { algorithm: 'fixed-window'; name: string; limit: number; windowMs: number }
  | { algorithm: 'sliding-window'; name: string; limit: number; windowMs: number }
  | { algorithm: 'token-bucket'; name: string; capacity: number; refill: number; intervalMs: number };

export interface LimiterSpec {
  /** 'own': over the store itself; 'hitOnly': over a store that has only hit(). */
  over: 'own' | 'hitOnly';
  /** The limits of each tier ('' when the limiter has no tiers). */
  tiers: Record<string, Rule[]>;
  /** Delay before each give-back (refund, decrement, negative hit) reaches the store, in ms. */
  giveBackDelayMs: number;
}

export type Call =
  | { op: 'hit'; key: string; windowMs: number; amount: number }
  | { op: 'consume'; key: string; limit: number; windowMs: number; cost: number }
  | { op: 'refund'; key: string; amount: number }
  | { op: 'sInc' | 'sDec'; key: string; windowMs: number; amount: number }
  | { op: 'sCon'; key: string; limit: number; windowMs: number; cost: number }
  | { op: 'bucket'; key: string; capacity: number; refill: number; intervalMs: number; cost: number }
  | { op: 'reset'; key: string }
  | { op: 'resetAll' }
  | { op: 'check'; limiter: number; key: string; cost: number; tier: string }
  | { op: 'uInc' | 'uDec'; adapter: number; key: string }
  | { op: 'eGet' | 'eInc' | 'eDec'; adapter: number; key: string };

export type Step =
  | { kind: 'calls'; calls: Call[]; /** index of a call awaited before the next is sent, or -1 */ waitAfter: number }
  | { kind: 'sleep'; ms: number }
  | { kind: 'edge'; windowMs: number; offsetMs: number }
  | { kind: 'flushScripts' };

export interface AdapterSpec {
  kind: 'universal' | 'express';
  algorithm: 'fixed-window' | 'sliding-window';
  windowMs: number;
}

export interface Sequence {
  seed: number;
  limiters: LimiterSpec[];
  adapters: AdapterSpec[];
  steps: Step[];
}

/** What one store can run: the kinds a store's gates leave in. */
export interface StoreTraits {
  name: string;
  memory: boolean;
  redis: boolean;
  rest: boolean;
  /** A memoryStore with a tiny maxKeys: any state may have been dropped (whole) before a call. */
  evicts: boolean;
}

const FIXED_WINDOWS = [1, 2, 5, 10, 25, 50, 100, 250, 1000, 2000];
const SLIDING_WINDOWS = [1, 2, 5, 10, 25, 50, 100, 250, 1000, 2000];
const LIMITS = [0, 1, 1, 2, 3, 5, 10];
const KEYS = ['a', 'b', 'c'];

/**
 * The sequence of a seed for one store: one generator, so every store runs the same operations
 * except the kinds its gates leave out (each gated kind is skipped by the same draws, so the rest of
 * the sequence stays the same).
 */
export function generate(seed: number, traits: StoreTraits, known: Known, steps = 40): Sequence {
  const r = prng(seed);
  const slidingOff = (traits.memory && known.memorySlidingClock) || (traits.evicts && known.memoryEviction);
  const shortOff = traits.memory && known.memoryShortWindow;
  const fixedWindows = FIXED_WINDOWS.filter((w) => !(shortOff && w < 5));
  // Per key: its fixed window and its sliding windows (a second one reads the state under another length).
  const fixedOf = new Map(KEYS.map((k) => [k, r.pick(fixedWindows)]));
  const slidingOf = new Map(KEYS.map((k) => [k, [r.pick(SLIDING_WINDOWS), r.pick(SLIDING_WINDOWS)]]));
  const oneSliding = r.pick(SLIDING_WINDOWS);
  const slidingPick = () => (known.slidingWindowMs ? oneSliding : r.pick(SLIDING_WINDOWS));
  const slidingWindow = (key: string) => {
    const [first, second] = slidingOf.get(key)!;
    const other = r.chance(0.15);
    if (known.slidingWindowMs) return oneSliding;
    return other ? second : first;
  };
  const limit = () => r.pick(LIMITS);
  // A bucket's state is read with the parameters it was written with (docs/algorithms.md: other
  // parameters may read it differently), so each key has one bucket, and the limiters one between them.
  const shared: Rule = {
    algorithm: 'token-bucket',
    name: 't',
    capacity: r.int(1, 4),
    refill: r.int(1, 2),
    intervalMs: r.pick([5, 20, 100, 500]),
  };
  const bucketRule = (): Rule => shared;
  const bucketOf = new Map(KEYS.map((k) => [k, r.pick([5, 50])]));
  const slidingRule: Rule = {
    algorithm: 'sliding-window',
    name: 's',
    limit: r.int(0, 3),
    windowMs: slidingPick(),
  };
  const limiters: LimiterSpec[] = [];
  const limiterCount = traits.evicts ? 0 : 3;
  for (let i = 0; i < limiterCount; i++) {
    const kind = r.pick(['single', 'several', 'tiers', 'hitOnly'] as const);
    const fixed = (name = 'f'): Rule => ({
      algorithm: 'fixed-window',
      name,
      limit: r.int(0, 3),
      windowMs: r.pick(fixedWindows),
    });
    const sliding = (): Rule => slidingRule;
    let tiers: Record<string, Rule[]>;
    let over: LimiterSpec['over'] = 'own';
    if (kind === 'single') tiers = { '': [fixed()] };
    else if (kind === 'several') {
      const rules = [fixed(), ...(slidingOff ? [] : [sliding()]), bucketRule()];
      tiers = { '': rules };
    } else if (kind === 'tiers') tiers = { free: [fixed()], pro: [fixed('f'), bucketRule()] };
    else {
      tiers = { '': [fixed()] };
      over = 'hitOnly';
    }
    const delay = r.pick([0, 0, 1, 5, 30, 120]);
    if (over === 'hitOnly' && known.giveBackWindow) continue;
    limiters.push({ over, tiers, giveBackDelayMs: known.giveBackWindow ? 0 : delay });
  }
  const adapters: AdapterSpec[] = [];
  if (!traits.evicts) {
    for (const kind of ['universal', 'express'] as const) {
      const algorithm = r.chance(0.5) && !slidingOff ? 'sliding-window' : 'fixed-window';
      adapters.push({
        kind,
        algorithm,
        windowMs: algorithm === 'fixed-window' ? r.pick(fixedWindows) : slidingPick(),
      });
    }
  }

  const call = (key = r.pick(KEYS)): Call | undefined => {
    const kind = r.int(0, 15);
    switch (kind) {
      case 0:
      case 1:
        return { op: 'hit', key, windowMs: fixedOf.get(key)!, amount: r.pick([0, 1, 1, 2, 3]) };
      case 2:
      case 3: {
        const l = limit();
        return { op: 'consume', key, limit: l, windowMs: fixedOf.get(key)!, cost: r.int(0, l + 1) };
      }
      case 4:
        return { op: 'refund', key, amount: r.int(0, 2) };
      case 5:
      case 6: {
        const l = limit();
        const c: Call = { op: 'sCon', key, limit: l, windowMs: slidingWindow(key), cost: r.int(0, l + 1) };
        return slidingOff ? undefined : c;
      }
      case 7: {
        const c: Call = { op: r.chance(0.6) ? 'sInc' : 'sDec', key, windowMs: slidingWindow(key), amount: r.int(0, 2) };
        return slidingOff ? undefined : c;
      }
      case 8:
        return { op: 'bucket', key, capacity: 3, refill: 1, intervalMs: bucketOf.get(key)!, cost: r.int(0, 4) };
      case 9:
        return r.chance(0.3) ? { op: 'reset', key } : { op: 'hit', key, windowMs: fixedOf.get(key)!, amount: 1 };
      case 10:
        return r.chance(0.15) ? { op: 'resetAll' } : undefined;
      case 11:
      case 12:
      case 13: {
        if (limiters.length === 0) return undefined;
        const i = r.int(0, limiters.length - 1);
        const tier = r.pick(Object.keys(limiters[i].tiers));
        return { op: 'check', limiter: i, key, cost: r.int(1, 3), tier };
      }
      default: {
        if (adapters.length === 0) return undefined;
        const adapter = r.int(0, adapters.length - 1);
        // A decrement is made only right after the increment it undoes (see the single steps below).
        if (adapters[adapter].kind === 'universal') return { op: 'uInc', adapter, key };
        return { op: r.pick(['eGet', 'eInc'] as const), adapter, key };
      }
    }
  };

  const out: Step[] = [];
  for (let i = 0; i < steps; i++) {
    const kind = r.int(0, 9);
    if (kind <= 4) {
      const c = call();
      if (c !== undefined) out.push({ kind: 'calls', calls: [c], waitAfter: -1 });
      // An adapter's decrement undoes a request's increment once that has answered, as
      // express-rate-limit and universal-rate-limit call it: it gives back to the window the
      // increment counted in, never to one opened later.
      // Such pairs go on a key of their own, where no increment is left to give back first (the
      // adapters give back the oldest increment they hold).
      if (c !== undefined && (c.op === 'uInc' || c.op === 'eInc') && r.chance(0.4)) {
        const key = `pair${c.adapter}`;
        out.push({ kind: 'calls', calls: [{ ...c, key }], waitAfter: -1 });
        out.push({
          kind: 'calls',
          calls: [{ op: c.op === 'uInc' ? 'uDec' : 'eDec', adapter: c.adapter, key }],
          waitAfter: -1,
        });
      }
    } else if (kind <= 6) {
      // A parallel group: several calls sent in one tick, mostly on one key.
      const n = r.int(2, 4);
      const calls: Call[] = [];
      const key = r.pick(KEYS);
      // Half of them: one call made n times at once (the race of parallel requests).
      const same = r.chance(0.5) ? call(key) : undefined;
      for (let j = 0; j < n; j++) {
        const c = same !== undefined ? { ...same } : call(r.chance(0.7) ? key : undefined);
        if (c === undefined) continue;
        if (c.op === 'resetAll' && traits.redis && known.resetAllOrder) continue;
        // Parallel checks are not one step each: a give-back in flight may refuse a concurrent check
        // ("fewer, never more", the limiter suite's concurrency cases), which the model cannot predict.
        if (c.op === 'check') continue;
        calls.push(c);
      }
      const waitAfter = r.chance(0.3) ? 0 : -1;
      const restOff = traits.rest && known.callOrder;
      if (calls.length > 0) {
        if (restOff) for (const c of calls) out.push({ kind: 'calls', calls: [c], waitAfter: -1 });
        else out.push({ kind: 'calls', calls, waitAfter });
      }
    } else if (kind === 7) {
      out.push({ kind: 'sleep', ms: r.pick([0, 1, 2, 5, 10, 30]) });
    } else if (kind === 8) {
      out.push({ kind: 'edge', windowMs: r.pick([5, 10, 25, 50, 100, 250]), offsetMs: r.int(-2, 2) });
    } else {
      const pattern = r.int(0, 4);
      const hitOnly = limiters.findIndex((l) => l.over === 'hitOnly');
      if (pattern === 4 && hitOnly >= 0) {
        // Over a hit-only store a refused hit stays counted: three checks, then a read of the count.
        const tier = Object.keys(limiters[hitOnly].tiers)[0];
        const rule = limiters[hitOnly].tiers[tier][0] as Extract<Rule, { windowMs: number }>;
        const check: Call = { op: 'check', limiter: hitOnly, key: 'h', cost: 1, tier };
        for (let j = 0; j < 3; j++) out.push({ kind: 'calls', calls: [{ ...check }], waitAfter: -1 });
        out.push({
          kind: 'calls',
          calls: [{ op: 'hit', key: 'h', windowMs: rule.windowMs, amount: 0 }],
          waitAfter: -1,
        });
        continue;
      }
      if (pattern === 3 && traits.evicts && !slidingOff) {
        // A full table meets a sliding state with a previous and a current window: it keeps or drops it whole.
        const w = known.slidingWindowMs ? oneSliding : 100;
        const one = (c: Call): Step => ({ kind: 'calls', calls: [c], waitAfter: -1 });
        out.push(one({ op: 'resetAll' }));
        out.push(one({ op: 'sInc', key: 'e', windowMs: w, amount: 6 }));
        if (w <= 250) out.push({ kind: 'edge', windowMs: w, offsetMs: 1 });
        out.push(one({ op: 'sInc', key: 'e', windowMs: w, amount: 1 }));
        // Two more counters than the state's two fit in maxKeys 3: one of the state's goes.
        for (const key of ['f', 'g']) out.push(one({ op: 'hit', key, windowMs: 2000, amount: 1 }));
        out.push(one({ op: 'sInc', key: 'e', windowMs: w, amount: 0 }));
        continue;
      }
      if (pattern === 1 && !(traits.redis && known.resetAllOrder)) {
        // resetAll between two hits in one tick: the second hit counts after it.
        const key = r.pick(KEYS);
        const hit: Call = { op: 'hit', key, windowMs: fixedOf.get(key)!, amount: 1 };
        out.push({ kind: 'calls', calls: [hit, { op: 'resetAll' }, { ...hit }], waitAfter: -1 });
        continue;
      }
      if (pattern === 2 && !shortOff) {
        // Two parallel consumes at limit 1 on a window of 1 ms: one passes (unless a ms edge falls between).
        const c: Call = { op: 'consume', key: 'd', limit: 1, windowMs: 1, cost: 1 };
        out.push({ kind: 'calls', calls: [c, { ...c }], waitAfter: -1 });
        continue;
      }
      const flush = pattern === 0;
      if (flush && traits.redis && !known.callOrder) {
        out.push({ kind: 'flushScripts' });
        const key = r.pick(KEYS);
        // NOSCRIPT's case: a consume then a hit on one key in one tick, right after the scripts went.
        out.push({
          kind: 'calls',
          calls: [
            { op: 'consume', key, limit: 5, windowMs: fixedOf.get(key)!, cost: 1 },
            { op: 'hit', key, windowMs: fixedOf.get(key)!, amount: 3 },
          ],
          waitAfter: -1,
        });
      }
    }
  }
  return { seed, limiters, adapters, steps: out };
}

// -------------------------------------------------------------------------------------------------
// Applying a call to the model

const remainingOf = (limit: number, count: number) => Math.min(limit, Math.max(0, limit - count));

function applyCheck(m: Model, spec: LimiterSpec, call: Extract<Call, { op: 'check' }>, t: number): unknown {
  const rules = spec.tiers[call.tier];
  const suffix = (rule: Rule) => (rules.length === 1 ? '' : `:${rule.name}`);
  if (spec.over === 'hitOnly') {
    // The store has only hit: a refused hit stays counted (the limiter never gives back there).
    const rule = rules[0] as Extract<Rule, { limit: number }>;
    const hit = m.hit(call.key, rule.windowMs, call.cost, t);
    return { allowed: hit.count <= rule.limit, limits: [hit.count <= rule.limit] };
  }
  const answers = new Map<Rule, { allowed: boolean; back?: () => void }>();
  for (const rule of rules) {
    const key = call.key + suffix(rule);
    if (rule.algorithm === 'fixed-window') {
      const a = m.consume(key, { limit: rule.limit, windowMs: rule.windowMs, cost: call.cost }, t);
      answers.set(rule, { allowed: a.allowed, back: () => m.refund(key, call.cost, t) });
    } else if (rule.algorithm === 'sliding-window') {
      const a = m.slidingConsume(key, { limit: rule.limit, windowMs: rule.windowMs, cost: call.cost }, t);
      answers.set(rule, { allowed: a.allowed, back: () => m.slidingDecrement(key, rule.windowMs, call.cost, t) });
    }
  }
  let allowed = [...answers.values()].every((a) => a.allowed);
  const bucket = rules.find((rule) => rule.algorithm === 'token-bucket');
  if (bucket !== undefined && bucket.algorithm === 'token-bucket' && allowed) {
    const a = m.tokenBucket(call.key + suffix(bucket), { ...bucket, cost: call.cost }, t);
    answers.set(bucket, { allowed: a.allowed });
    allowed = a.allowed;
  }
  // A refused request gives back what the others took, to the window it took it from (at t).
  if (!allowed) for (const a of answers.values()) if (a.allowed) a.back?.();
  return { allowed, limits: rules.map((rule) => answers.get(rule)?.allowed ?? true) };
}

/** The model's answer to a call at time t (µs), in the shape `observe` gives the store's. */
export function applyCall(m: Model, seq: Sequence, c: Call, t: number): unknown {
  switch (c.op) {
    case 'hit':
      return m.hit(c.key, c.windowMs, c.amount, t);
    case 'consume':
      return m.consume(c.key, c, t);
    case 'refund':
      return m.refund(c.key, c.amount, t);
    case 'sInc':
      return m.slidingIncrement(c.key, c.windowMs, c.amount, t);
    case 'sDec':
      return m.slidingDecrement(c.key, c.windowMs, c.amount, t);
    case 'sCon': {
      const a = m.slidingConsume(c.key, c, t);
      return { ...a, retryIsZero: a.allowed };
    }
    case 'bucket': {
      const a = m.tokenBucket(c.key, c, t);
      return { allowed: a.allowed, remaining: a.remaining, resetMs: a.resetMs, retryMs: a.retryMs };
    }
    case 'reset':
      m.reset(c.key);
      return null;
    case 'resetAll':
      m.resetAll();
      return null;
    case 'check':
      return applyCheck(m, seq.limiters[c.limiter], c, t);
    case 'uInc':
    case 'uDec':
    case 'eGet':
    case 'eInc':
    case 'eDec': {
      const spec = seq.adapters[c.adapter];
      const key = spec.kind === 'express' ? `x:${c.key}` : c.key;
      const sliding = spec.algorithm === 'sliding-window';
      if (c.op === 'uInc' || c.op === 'eInc') {
        const a = sliding ? m.slidingIncrement(key, spec.windowMs, 1, t) : m.hit(key, spec.windowMs, 1, t);
        return { totalHits: a.count, resetMs: a.resetMs };
      }
      if (c.op === 'uDec' || c.op === 'eDec') {
        if (sliding) m.slidingDecrement(key, spec.windowMs, 1, t);
        else m.refund(key, 1, t);
        return null;
      }
      const a = sliding ? m.slidingIncrement(key, spec.windowMs, 0, t) : m.refund(key, 0, t);
      // A fixed window answers while open (even at 0); a sliding state only while it counts something.
      return a === null || (sliding && a.count <= 0) ? null : { totalHits: a.count, resetMs: a.resetMs };
    }
  }
}

/** The store key (and algorithm) a call reads, for eviction candidates and edge times. */
export function touched(
  seq: Sequence,
  c: Call,
): { key: string; algorithm: 'fixed' | 'sliding' | 'bucket' } | undefined {
  switch (c.op) {
    case 'hit':
    case 'consume':
    case 'refund':
      return { key: c.key, algorithm: 'fixed' };
    case 'sInc':
    case 'sDec':
    case 'sCon':
      return { key: c.key, algorithm: 'sliding' };
    case 'bucket':
      return { key: c.key, algorithm: 'bucket' };
    default:
      return undefined;
  }
}

const APPROX = new Set(['resetMs', 'retryMs']);

/** Whether an observed answer matches the model's: exact fields equal, times within `tolMs`. */
export function matches(model: unknown, observed: unknown, tolMs: number): boolean {
  if (model === null || observed === null || typeof model !== 'object' || typeof observed !== 'object') {
    return model === observed;
  }
  for (const [field, value] of Object.entries(model as Record<string, unknown>)) {
    const seen = (observed as Record<string, unknown>)[field];
    if (APPROX.has(field)) {
      if (typeof seen !== 'number' || Math.abs(seen - (value as number)) > tolMs) return false;
    } else if (seen !== value) {
      // Numbers, booleans and strings are equal only when ===; arrays and objects by their JSON.
      if (typeof value !== 'object' || value === null || JSON.stringify(seen) !== JSON.stringify(value)) return false;
    }
  }
  return true;
}

export const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * US);

/** The times worth trying in [a, b]: evenly spaced ones, and both sides of every edge of the windows in play. */
export function timesIn(a: number, b: number, spans: number[], ends: number[]): number[] {
  const points = new Set<number>();
  const n = 24;
  for (let i = 0; i <= n; i++) points.add(Math.round(a + ((b - a) * i) / n));
  for (const span of spans) {
    const w = span * US;
    if ((b - a) / w > 40) continue;
    for (let e = a - (a % w) + w; e <= b; e += w) {
      points.add(e - 1);
      points.add(e);
    }
  }
  for (const e of ends) {
    if (e - 1 >= a && e - 1 <= b) points.add(e - 1);
    if (e >= a && e <= b) points.add(e);
  }
  return [...points].sort((x, y) => x - y);
}
