'use strict';
// The block cache of a limiter: what a shared store refused, kept in this process until the time the
// refusal named, so that the same key's checks are refused without a store call meanwhile.
//
// The rule (docs/algorithms.md, "The block cache"): a limit's counts on a key only grow until its
// refusal's time has come, but for a refund, a decrement, a reset (which this process tells the cache
// of, see watch.js) or a write under other parameters. So a refusal proves, until then:
// - a fixed window that answered `remaining` r: every cost above r is refused until the window ends;
// - a sliding window or a token bucket that refused cost c: every cost of c or more is refused until
//   the retry time it answered (its state only moves towards refusing c, but for time passing, which
//   that time accounts for).
// Times are counted from when the check was sent, which is no later than the store's own clock read,
// less 1 ms for the store's rounding up: an entry ends no later than the refusal it repeats.

const { createHash } = require('node:crypto');

const FAMILY = { 'fixed-window': 'fixed', 'sliding-window': 'sliding', 'token-bucket': 'bucket', concurrency: 'fixed' };
/**
 * The longest store key an entry is kept under as it is; a longer one is kept under its SHA-256. V8
 * hashes a string of more than 16,383 characters by its length alone, so long keys of one length would
 * all land in one hash bucket and turn every lookup into a scan; a digest also keeps an entry's size
 * bounded whatever the key's.
 */
const LONG_KEY = 256;
/** What an entry costs beyond its id, counted against `maxBytes`: the entry, its snapshot share, the Map slot. */
const ENTRY_BYTES = 256;

/**
 * An entry's id: the limit's tag (its number and a space), then `k` and the store key, or `d` and the
 * key's digest (its UTF-16 units as they are, lone surrogates included), so that no key's id is
 * another's.
 */
function idOf(tag, storeKey) {
  if (storeKey.length <= LONG_KEY) return `${tag}k${storeKey}`;
  return `${tag}d${createHash('sha256').update(storeKey, 'utf16le').digest('base64')}`;
}

/** The bytes an entry of this id is counted as. */
const bytesOf = (id) => 2 * id.length + ENTRY_BYTES;

class BlockCache {
  /** idOf(tag, storeKey) → entry { minCost, until, remaining, resetEnd, retryEnd, snapshot }. */
  entries = new Map();
  /** The bytes the entries are counted as (see bytesOf), at most #maxBytes. */
  bytes = 0;
  /** tag + storeKey → { inFlight, settled }: calls that may lower that count, in flight or lately settled. */
  #changes = new Map();
  /** A resetAll() in flight or settled: { inFlight, settled }. */
  #all = { inFlight: 0, settled: 0 };
  /** A change record dropped to stay bounded: checks started before it keep no refusal. */
  #forgotten = 0;
  /** Ticks at each check's start and each change's end: an order of events. */
  seq = 0;
  refusals = 0;
  evictions = 0;
  #max;
  #maxBytes;
  /** Every limit of the limiter, with its family and parameters. */
  #rules;

  constructor(maxKeys, rules, maxBytes = Infinity) {
    this.#max = maxKeys;
    this.#maxBytes = maxBytes;
    this.#rules = rules;
  }

  /** Removes the entry `id` (which must be held). */
  #delete(id) {
    this.entries.delete(id);
    this.bytes -= bytesOf(id);
  }

  get size() {
    return this.entries.size;
  }

  /**
   * The entries that prove a check of `cost` on `key` under `set` refused now: `{ proven, longest }`, a
   * Map of rule → entry and the entry that lasts longest (whose snapshot answers for the other limits),
   * or undefined (then the check goes to the store).
   */
  refusing(set, key, cost, now) {
    const entries = this.entries;
    if (entries.size === 0) return undefined;
    let proven;
    for (const rule of set.rules) {
      const id = idOf(rule.tag, key + rule.suffix);
      const entry = entries.get(id);
      if (entry === undefined) continue;
      if (now >= entry.until) {
        this.#delete(id);
        continue;
      }
      if (cost >= entry.minCost) (proven ??= new Map()).set(rule, entry);
    }
    if (proven === undefined) return undefined;
    // The answer reports the other limits as the store last answered them: only while every limit that
    // refused then is still proven here (one whose entry has ended may refuse or not: the store says).
    let longest;
    for (const entry of proven.values()) if (longest === undefined || entry.until > longest.until) longest = entry;
    const complete = set.rules.every((rule, i) => proven.has(rule) || !longest.snapshot[i]?.refused);
    return complete ? { proven, longest } : undefined;
  }

  /** Forgets what the store answered the set's limits for `key`: a check went to the store and was allowed. */
  forget(set, key) {
    if (this.entries.size === 0) return;
    for (const rule of set.rules) {
      const id = idOf(rule.tag, key + rule.suffix);
      if (this.entries.has(id)) this.#delete(id);
    }
  }

  /**
   * Keeps a refusal of `cost`: `taken` is each limit's answer (after the give-backs), `started` the
   * tick at the check's start and `sentAt` the time (performance.now()) its store calls were made.
   */
  remember(set, key, cost, taken, started, sentAt) {
    if (this.#forgotten > started || this.#all.inFlight > 0 || this.#all.settled > started) return;
    let snapshot;
    for (const rule of set.rules) {
      const answer = taken.get(rule);
      // A concurrency limit's refusal proves nothing for later: a lease may be given back at any time.
      if (answer === undefined || answer.allowed || rule.algorithm === 'concurrency') continue;
      const id = idOf(rule.tag, key + rule.suffix);
      const change = this.#changes.get(id);
      if (change !== undefined && (change.inFlight > 0 || change.settled > started)) continue;
      const retryEnd = sentAt + answer.retryMs;
      const until = retryEnd - 1;
      if (!(until > performance.now())) continue;
      snapshot ??= set.rules.map((r) => {
        const a = taken.get(r);
        return a === undefined
          ? undefined
          : { remaining: a.remaining, resetEnd: sentAt + a.resetMs, refused: !a.allowed };
      });
      const minCost = rule.algorithm === 'fixed-window' ? answer.remaining + 1 : cost;
      const entry = {
        minCost,
        until,
        remaining: answer.remaining,
        resetEnd: sentAt + answer.resetMs,
        retryEnd,
        snapshot,
      };
      const entries = this.entries;
      if (entries.has(id)) this.#delete(id);
      entries.set(id, entry);
      this.bytes += bytesOf(id);
      while (entries.size > this.#max || (this.bytes > this.#maxBytes && entries.size > 1)) {
        this.#delete(entries.keys().next().value);
        this.evictions++;
      }
    }
  }

  /**
   * A call that may lower a count of `storeKey` is about to run (see watch.js): forgets the entries it
   * may change, and answers the function to call once it settles (or undefined: it changes none).
   */
  changing(kind, storeKey, params) {
    if (kind === 'all') {
      this.entries.clear();
      this.bytes = 0;
      const all = this.#all;
      all.inFlight++;
      return () => {
        all.inFlight--;
        all.settled = ++this.seq;
      };
    }
    let records;
    for (const rule of this.#rules) {
      const family = FAMILY[rule.algorithm];
      const affected =
        kind === 'reset' ||
        kind === family ||
        (kind === 'sliding-params' && family === 'sliding' && rule.windowMs !== params) ||
        (kind === 'bucket-params' && family === 'bucket' && rule.params !== params);
      if (!affected) continue;
      const id = idOf(rule.tag, storeKey);
      if (this.entries.has(id)) this.#delete(id);
      const changes = this.#changes;
      let change = changes.get(id);
      if (change === undefined) change = { inFlight: 0, settled: 0 };
      else changes.delete(id);
      changes.set(id, change);
      change.inFlight++;
      (records ??= []).push(change);
    }
    if (records === undefined) return undefined;
    while (this.#changes.size > this.#max) if (!this.#drop()) break;
    return () => {
      const tick = ++this.seq;
      for (const change of records) {
        change.inFlight--;
        change.settled = tick;
      }
    };
  }

  /** Drops the oldest settled change record (checks that started before it keep nothing); false if none is settled. */
  #drop() {
    let scanned = 0;
    for (const [id, change] of this.#changes) {
      if (change.inFlight === 0) {
        this.#changes.delete(id);
        if (change.settled > this.#forgotten) this.#forgotten = change.settled;
        return true;
      }
      if (++scanned > 64) return false;
    }
    return false;
  }
}

module.exports = { BlockCache, idOf, LONG_KEY };
