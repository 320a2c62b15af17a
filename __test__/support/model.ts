// An executable model of docs/algorithms.md under the shared store rules: plain code on an explicit
// clock (epoch µs), written from the documents rather than from src/, so that the stores can be
// checked against it. A Model holds the state of every key; each operation takes the time it runs at.

export const US = 1000;

export interface FixedState {
  count: number;
  /** The whole millisecond the window ends at (Redis keeps a PTTL in whole ms). */
  endMs: number;
}
export interface SlidingState {
  /** Start of the window `current` counts, in µs (aligned on the epoch for the windowMs it was written with). */
  start: number;
  previous: number;
  current: number;
  /** When it stops counting, in µs: one window after `start` (of the windowMs it was last written with), two while `current` counts. */
  ends: number;
}
export interface BucketState {
  tokens: number;
  /** µs of the last refill. */
  at: number;
}

const ceilDiv = (a: number, b: number) => Math.floor((a + b - 1) / b);
const clamp = (value: number, low: number, high: number) => Math.min(high, Math.max(low, value));

export class Model {
  /**
   * How the previous window's share rounds: 'ceil' is the rule (seed 004's); 'floor' is the code
   * before the fix, for the differential suite while that fix is not merged (KNOWN.slidingCeil).
   */
  constructor(readonly rounding: 'ceil' | 'floor' = 'ceil') {}

  fixed = new Map<string, FixedState>();
  sliding = new Map<string, SlidingState>();
  bucket = new Map<string, BucketState>();

  clone(): Model {
    const copy = new Model(this.rounding);
    for (const [k, v] of this.fixed) copy.fixed.set(k, { ...v });
    for (const [k, v] of this.sliding) copy.sliding.set(k, { ...v });
    for (const [k, v] of this.bucket) copy.bucket.set(k, { ...v });
    return copy;
  }

  /** A canonical text of the state, so that equal candidates are kept once. */
  signature(): string {
    // Built by hand, not with JSON.stringify: the differential suite asks for it for every state a
    // call's slack allows, and it was most of that suite's CPU time.
    const part = <T>(tag: string, m: Map<string, T>, fields: (v: T) => string) => {
      const keys = [...m.keys()];
      if (keys.length > 1) keys.sort();
      let out = tag;
      for (const key of keys) out += `${key}\u0000${fields(m.get(key)!)}\u0001`;
      return out;
    };
    return (
      part('f', this.fixed, (v) => `${v.count},${v.endMs}`) +
      part('s', this.sliding, (v) => `${v.start},${v.previous},${v.current},${v.ends}`) +
      part('b', this.bucket, (v) => `${v.tokens},${v.at}`)
    );
  }

  // -------------------------------------------------------------------------------------------
  // Fixed window. A window opened at ms t lasts windowMs whole ms: it is open while the clock's
  // whole ms is before t + windowMs (under 1 ms left counts as ended).

  private openWindow(key: string, nowUs: number): FixedState | undefined {
    const state = this.fixed.get(key);
    if (state === undefined) return undefined;
    if (Math.floor(nowUs / US) < state.endMs) return state;
    this.fixed.delete(key);
    return undefined;
  }

  private resetOf(state: FixedState, nowUs: number): number {
    return state.endMs - Math.floor(nowUs / US);
  }

  hit(key: string, windowMs: number, amount: number, nowUs: number): { count: number; resetMs: number } {
    const open = this.openWindow(key, nowUs);
    if (open === undefined) {
      if (amount === 0) return { count: 0, resetMs: windowMs };
      this.fixed.set(key, { count: amount, endMs: Math.floor(nowUs / US) + windowMs });
      return { count: amount, resetMs: windowMs };
    }
    open.count += amount;
    return { count: open.count, resetMs: this.resetOf(open, nowUs) };
  }

  consume(
    key: string,
    { limit, windowMs, cost = 1 }: { limit: number; windowMs: number; cost?: number },
    nowUs: number,
  ): { allowed: boolean; count: number; remaining: number; resetMs: number } {
    const open = this.openWindow(key, nowUs);
    let count = open?.count ?? 0;
    const resetMs = open === undefined ? windowMs : this.resetOf(open, nowUs);
    const allowed = count + cost <= limit;
    if (allowed && cost > 0) {
      if (open === undefined) this.fixed.set(key, { count: cost, endMs: Math.floor(nowUs / US) + windowMs });
      else open.count += cost;
      count += cost;
    }
    return { allowed, count, remaining: clamp(limit - count, 0, limit), resetMs };
  }

  refund(key: string, amount: number, nowUs: number): { count: number; resetMs: number } | null {
    const open = this.openWindow(key, nowUs);
    if (open === undefined) return null;
    open.count -= Math.min(amount, Math.max(open.count, 0));
    return { count: open.count, resetMs: this.resetOf(open, nowUs) };
  }

  // -------------------------------------------------------------------------------------------
  // Sliding window, aligned on the epoch: count = ceil(previous * left / window) + current.

  /** The state as read under `windowMs` at `nowUs`: its previous and current counts, and the geometry. */
  private slide(key: string, windowMs: number, nowUs: number) {
    const window = windowMs * US;
    let start = nowUs - (nowUs % window);
    const left = start + window - nowUs; // 1..=window
    let stored = this.sliding.get(key);
    // A state written under a shorter windowMs may have stopped counting before this one's grid says.
    if (stored !== undefined && nowUs >= stored.ends) stored = undefined;
    let previous = 0;
    let current = 0;
    if (stored !== undefined && stored.start >= start) {
      // The current window's state, or one written under another windowMs that starts inside this
      // window (or ahead of the clock): it counts in full, and keeps its start.
      start = stored.start;
      previous = stored.previous;
      current = stored.current;
    } else if (stored !== undefined && stored.start === start - window) {
      previous = stored.current;
    }
    return { window, start, left, previous, current, resetMs: ceilDiv(left, US) };
  }

  private estimate(s: { previous: number; current: number; left: number; window: number }): number {
    const share = s.previous * s.left;
    return (this.rounding === 'ceil' ? ceilDiv(share, s.window) : Math.floor(share / s.window)) + s.current;
  }

  private store(key: string, s: { start: number; window: number; previous: number; current: number }) {
    if (s.previous === 0 && s.current === 0) this.sliding.delete(key);
    else {
      const ends = s.start + (s.current > 0 ? 2 : 1) * s.window;
      this.sliding.set(key, { start: s.start, previous: s.previous, current: s.current, ends });
    }
  }

  slidingIncrement(key: string, windowMs: number, amount: number, nowUs: number): { count: number; resetMs: number } {
    const s = this.slide(key, windowMs, nowUs);
    if (amount > 0) {
      s.current += amount;
      this.store(key, s);
    }
    return { count: this.estimate(s), resetMs: s.resetMs };
  }

  slidingDecrement(key: string, windowMs: number, amount: number, nowUs: number): { count: number; resetMs: number } {
    const s = this.slide(key, windowMs, nowUs);
    const fromCurrent = Math.min(amount, s.current);
    s.current -= fromCurrent;
    const fromPrevious = Math.min(amount - fromCurrent, s.previous);
    s.previous -= fromPrevious;
    // Nothing taken, nothing written: a state that counts nothing under this windowMs may still count under its own.
    if (fromCurrent + fromPrevious > 0) this.store(key, s);
    return { count: this.estimate(s), resetMs: s.resetMs };
  }

  slidingConsume(
    key: string,
    { limit, windowMs, cost = 1 }: { limit: number; windowMs: number; cost?: number },
    nowUs: number,
  ): { allowed: boolean; count: number; remaining: number; resetMs: number } {
    const s = this.slide(key, windowMs, nowUs);
    let count = this.estimate(s);
    const allowed = cost <= limit && count + cost <= limit;
    if (allowed && cost > 0) {
      s.current += cost;
      count += cost;
      this.store(key, s);
    }
    return { allowed, count, remaining: clamp(limit - count, 0, limit), resetMs: s.resetMs };
  }

  // -------------------------------------------------------------------------------------------
  // Token bucket: `refill` whole tokens every intervalMs from the last refill, up to capacity; a full
  // bucket is no state.

  tokenBucket(
    key: string,
    { capacity, refill, intervalMs, cost = 1 }: { capacity: number; refill: number; intervalMs: number; cost?: number },
    nowUs: number,
  ): { allowed: boolean; remaining: number; retryMs: number; resetMs: number } {
    const interval = intervalMs * US;
    let tokens = capacity;
    let at = nowUs;
    const stored = this.bucket.get(key);
    if (stored !== undefined) {
      const missing = capacity - stored.tokens;
      if (missing > 0) {
        const refills = nowUs > stored.at ? Math.floor((nowUs - stored.at) / interval) : 0;
        if (refills < ceilDiv(missing, refill)) {
          tokens = stored.tokens + refills * refill;
          at = stored.at + refills * interval;
        }
      }
    }
    const fullAt = (have: number) => at + ceilDiv(Math.max(capacity - have, 0), refill) * interval;
    const msUntil = (t: number) => (t <= nowUs ? 0 : ceilDiv(t - nowUs, US));
    if (cost <= tokens) {
      const remaining = tokens - cost;
      if (cost > 0) {
        if (remaining < capacity) this.bucket.set(key, { tokens: remaining, at });
      } else if (tokens >= capacity) {
        this.bucket.delete(key);
      }
      return { allowed: true, remaining, retryMs: 0, resetMs: msUntil(fullAt(remaining)) };
    }
    if (tokens >= capacity) this.bucket.delete(key);
    const retryAt = cost > capacity ? fullAt(tokens) : at + ceilDiv(cost - tokens, refill) * interval;
    return {
      allowed: false,
      remaining: tokens,
      retryMs: Math.max(1, msUntil(retryAt)),
      resetMs: msUntil(fullAt(tokens)),
    };
  }

  // -------------------------------------------------------------------------------------------

  reset(key: string): void {
    this.fixed.delete(key);
    this.sliding.delete(key);
    this.bucket.delete(key);
  }

  resetAll(): void {
    this.fixed.clear();
    this.sliding.clear();
    this.bucket.clear();
  }

  /** Drops one key's state of one algorithm whole (what a full memoryStore may do). */
  evict(key: string, algorithm: 'fixed' | 'sliding' | 'bucket'): void {
    this[algorithm].delete(key);
  }
}
