'use strict';
// What the JS faces of the native stores that run their own thread (postgresStore, mysqlStore,
// sqliteStore) share: a call is checked by lib/ops.js and queued to the native thread, with the other
// calls of its turn of the microtask queue at the end of that turn (postgresStore), or by a synchronous
// call of its own (mysqlStore, sqliteStore); its promise is settled when its batch of results comes
// back (lib/in-flight.js), or at once where the native call ran it (sqliteStore, when idle) and
// answered `true`. Each store
// checks its own options and makes its own native store; the rest is here.

const { rejection } = require('./check.js');
const { ServerOperations, RESET_ALL, TAKES, checkTakes, toldStep } = require('./ops.js');
const { InFlight, sendStep } = require('./in-flight.js');

class ThreadedStore extends ServerOperations {
  #native;
  #failures;
  /** The calls in flight, their promises and the settling of each batch of results. */
  #inFlight;
  #open;
  /**
   * Calls made in this turn of the microtask queue (a burst: requests handled together, or the callers
   * that one batch of answers set going again), and in the last one. Only a call alone, the first of its
   * turn after a turn of at most one, with no call in flight, may run at once on this thread (sqliteStore,
   * in a transaction of its own): a caller that awaits each call before the next gets every call run at
   * once, while calls made together keep sharing the native thread's transactions, however many turns
   * they go on for. With no call in flight, every earlier call has settled: promises settle in the order
   * their calls were applied.
   */
  #burst = 0;
  #lastBurst = 0;
  #burstEnds = () => {
    this.#lastBurst = this.#burst;
    this.#burst = 0;
  };
  /** Whether the native store can run a call at once (sqliteStore): only then are bursts counted. */
  #atOnce;
  /**
   * Whether the calls of a turn of the microtask queue go to the native side together (postgresStore):
   * then `#gathered` holds those not yet sent, seven entries each (slot, op, a, b, c, d, key). They go
   * at the end of the turn, in the order they were made, on one trip to the native thread, so that the
   * calls one batch of answers set going again share the next batch (see "How a hit travels" in the
   * README). mysqlStore sends each call at once: its connections each take a batch as calls arrive.
   */
  #gather;
  #gathered = [];
  #sendGathered = () => this.#send();

  /**
   * `kind`: stats().kind; `failures`: the store's `Failures`; `make(settle)`: the native store, its
   * results settled by `settle`; `opens`: whether it reads the environment (`open(process.env)`) before
   * its first call; `figures(native)`: its own entries of stats(); `atOnce`: whether its native `call` can
   * run a call at once and answer `true` (sqliteStore); `gather`: whether the calls of a turn go to its
   * native `calls` together (postgresStore).
   */
  constructor({ kind, failures, make, opens, figures, atOnce = false, gather = false }) {
    super();
    this.#atOnce = atOnce;
    this.#gather = gather;
    this.#failures = failures;
    this.#inFlight = new InFlight(failures);
    const store = make(this.#inFlight.settle);
    this.#native = store;
    this.#open = this._serve({
      kind,
      native: store,
      failures,
      inFlight: this.#inFlight,
      figures,
      opens,
      beforeClose: () => this.#send(),
    });
    this.#inFlight.attach(store.results(), (held) => store.hold(held));
  }

  /** Deletes every counter of the store (see ops.js's resetAll). */
  [RESET_ALL]() {
    // The calls made before it go first.
    this.#send();
    let pending;
    try {
      this.#open();
      pending = this.#native.resetAll();
    } catch (error) {
      return rejection(this.#failures.failed(error));
    }
    // It settles through its own promise, with an Error to reject with.
    return this.#inFlight.follow(pending).then((value) => {
      if (value instanceof Error) throw this.#failures.failed(value);
      return undefined;
    });
  }

  /** Counts a call in its burst; whether it is a call alone (see #burst). */
  #alone() {
    const alone = this.#burst === 0 && this.#lastBurst <= 1 && this.#inFlight.count === 0;
    if (this.#burst++ === 0) queueMicrotask(this.#burstEnds);
    return alone;
  }

  _call(op, key, a, b, c, d) {
    const inFlight = this.#inFlight;
    this._count(1);
    if (this.#gather) {
      const slot = inFlight.slot();
      const promise = inFlight.track(slot, op);
      const gathered = this.#gathered;
      if (gathered.length === 0) queueMicrotask(this.#sendGathered);
      gathered.push(slot, op, a, b, c, d, key);
      return promise;
    }
    const slot = inFlight.slot();
    try {
      this.#open();
      // true: it ran at once (sqliteStore, a call alone: see #burst), its answer already in the results.
      if (this.#native.call(slot, op, key, a, b, c, d, this.#atOnce && this.#alone()) === true) {
        inFlight.free(slot);
        return Promise.resolve(inFlight.answered(op));
      }
    } catch (error) {
      inFlight.free(slot);
      return rejection(this.#failures.failed(error));
    }
    return inFlight.track(slot, op);
  }

  /** Sends the calls gathered so far (see #gathered): one alone as a call, more as one `calls`. */
  #send() {
    const gathered = this.#gathered;
    if (gathered.length === 0) return;
    this.#gathered = [];
    try {
      this.#open();
      if (gathered.length === 7) {
        const [slot, op, a, b, c, d, key] = gathered;
        this.#native.call(slot, op, key, a, b, c, d);
        return;
      }
      const numbers = [];
      let keys = '';
      for (let i = 0; i < gathered.length; i += 7) {
        const key = gathered[i + 6];
        numbers.push(
          gathered[i],
          gathered[i + 1],
          gathered[i + 2],
          gathered[i + 3],
          gathered[i + 4],
          gathered[i + 5],
          key.length,
        );
        keys += key;
      }
      this.#native.calls(numbers, keys);
    } catch (error) {
      for (let i = 0; i < gathered.length; i += 7) this.#inFlight.fail(gathered[i], error);
    }
  }

  /**
   * Several takes as one step (see ops.js's TAKES): made all, or none, in one transaction of the
   * native side (each store says how it locks).
   */
  [TAKES](takes) {
    const error = checkTakes(takes);
    if (error) return rejection(error);
    this.#send();
    return toldStep(this, takes, () => {
      this._count(takes.length);
      const send = (numbers, keys) => {
        this.#open();
        this.#native.takes(numbers, keys);
      };
      return sendStep(this.#inFlight, this.#failures, send, takes);
    });
  }
}

module.exports = { ThreadedStore };
