'use strict';
// What both stores share for operations: the count of failed calls by code
// and the onError option, and the Prometheus text exposition of stats().

const { checkOption } = require('./check.js');

/** A store's failed calls, by code, and its onError listener. */
class Failures {
  byCode = Object.create(null);
  #onError;

  constructor(factory, onError) {
    checkOption(factory, 'onError', onError, 'function');
    this.#onError = onError;
  }

  /** Counts a failed call and tells onError; answers the error, for the promise to reject with. */
  failed(error) {
    const code = typeof error?.code === 'string' ? error.code : 'ERR_INTERNAL';
    this.byCode[code] = (this.byCode[code] ?? 0) + 1;
    this.tell(error);
    return error;
  }

  /** Hands a failed call's error or a connection event to onError. A listener that throws is reported as uncaught. */
  tell(what) {
    const onError = this.#onError;
    if (onError === undefined) return;
    try {
      onError(what);
    } catch (thrown) {
      process.nextTick(() => {
        throw thrown;
      });
    }
  }

  /** A copy of the counts, for stats(). */
  snapshot() {
    return { ...this.byCode };
  }
}

const HELP = {
  calls: ['counter', 'Calls that reached the store (every operation counts; reset(key) counts three)'],
  errors: ['counter', 'Calls that rejected, by error code'],
  refusals: ['counter', 'Hits refused because the memory store was full of long windows (ERR_STORE_FULL)'],
  counters: ['gauge', 'Counters held by the memory store, ended windows not yet swept included'],
  counters_capacity: ['gauge', 'Most counters the memory store holds (maxKeys)'],
  evictions: ['counter', 'Counters dropped to make room, by reason: ended windows, or short windows before their end'],
  sweeps: ['counter', 'Rounds of the sweeper over the memory store'],
  swept_counters: ['counter', 'Ended windows the sweeper dropped'],
  calls_in_flight: ['gauge', 'Calls sent to Redis and not yet settled'],
  connects: ['counter', 'Connections to Redis opened'],
  reconnects: ['counter', 'Connections to Redis opened again after one was lost'],
  connect_failures: ['counter', 'Connects to Redis that failed'],
  connection_losses: ['counter', 'Open connections to Redis that failed'],
  timeouts: ['counter', 'Calls that got no answer within timeoutMs'],
  noscript_reloads: ['counter', 'Scripts sent again whole (EVAL) after NOSCRIPT'],
  redirections: ['counter', 'MOVED and ASK redirections followed (Redis Cluster)'],
  unconfirmed: ['counter', 'Calls that ran on the master but that fewer replicas than waitForReplicas confirmed'],
  sqlite_commits: ['counter', 'Transactions the SQLite store committed (each holds the calls queued meanwhile)'],
  sqlite_busy_waits: ['counter', 'SQLite transactions that waited for another connection to release the file'],
  call_latency_seconds: ['summary', 'Time from sending a call to Redis to its answer, over the store’s life'],
};

/** A label value, escaped as the text format asks. */
function escape(value) {
  return String(value).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/**
 * The Prometheus text exposition (format 0.0.4) of the stores' stats(), each labelled
 * `store="<name>"`: `metricsText({ api: store, jobs: other })`.
 */
function metricsText(stores) {
  if (stores === null || typeof stores !== 'object') {
    throw new TypeError('ratestore: metricsText(stores): stores must be an object of name → store');
  }
  /** name → lines of its samples, in the order first seen. */
  const samples = new Map();
  const add = (name, labels, value) => {
    const text = Object.entries(labels)
      .map(([k, v]) => `${k}="${escape(v)}"`)
      .join(',');
    const [type] = HELP[name.replace(/_(sum|count)$/, '')] ?? HELP[name];
    const family = type === 'counter' ? `ratestore_${name}_total` : `ratestore_${name}`;
    const base = name.endsWith('_sum') || name.endsWith('_count') ? name.replace(/_(sum|count)$/, '') : name;
    if (!samples.has(base)) samples.set(base, []);
    samples.get(base).push(`${family}{${text}} ${Number.isFinite(value) ? value : 0}`);
  };
  for (const [store, s] of Object.entries(stores)) {
    if (s === null || typeof s !== 'object' || typeof s.stats !== 'function') {
      throw new TypeError('ratestore: metricsText(stores): every value must be a ratestore store (it has no stats())');
    }
    const stats = s.stats();
    const label = { store };
    add('calls', { store, kind: stats.kind }, stats.calls);
    for (const [code, n] of Object.entries(stats.errors)) add('errors', { store, code }, n);
    if (stats.kind === 'memory') {
      add('refusals', label, stats.refusals);
      add('counters', label, stats.held);
      add('counters_capacity', label, stats.capacity);
      add('evictions', { store, reason: 'ended' }, stats.evictions.ended);
      add('evictions', { store, reason: 'short' }, stats.evictions.short);
      add('sweeps', label, stats.sweeps);
      add('swept_counters', label, stats.swept);
    } else if (stats.kind === 'sqlite') {
      add('calls_in_flight', label, stats.inFlight);
      add('sqlite_commits', label, stats.commits);
      add('sqlite_busy_waits', label, stats.busyWaits);
      add('swept_counters', label, stats.swept);
    } else {
      add('calls_in_flight', label, stats.inFlight);
      add('connects', label, stats.connects);
      add('reconnects', label, stats.reconnects);
      add('connect_failures', label, stats.connectFailures);
      add('connection_losses', label, stats.connectionLosses);
      add('timeouts', label, stats.timeouts);
      add('noscript_reloads', label, stats.noscriptReloads);
      add('redirections', label, stats.redirections);
      add('unconfirmed', label, stats.unconfirmed);
      const l = stats.latencyMs;
      for (const [quantile, ms] of [
        ['0.5', l.p50],
        ['0.9', l.p90],
        ['0.99', l.p99],
        ['1', l.max],
      ]) {
        add('call_latency_seconds', { store, quantile }, ms / 1000);
      }
      add('call_latency_seconds_sum', label, l.sumMs / 1000);
      add('call_latency_seconds_count', label, l.count);
    }
  }
  const lines = [];
  for (const [name, rows] of samples) {
    const [type, help] = HELP[name];
    const family = type === 'counter' ? `ratestore_${name}_total` : `ratestore_${name}`;
    lines.push(`# HELP ${family} ${help}`, `# TYPE ${family} ${type}`, ...rows);
  }
  return lines.length === 0 ? '' : `${lines.join('\n')}\n`;
}

module.exports = { Failures, metricsText };
