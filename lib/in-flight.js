'use strict';
// The calls a native store has in flight, for every store whose results come back in batches from
// the native side (redisStore, postgresStore): each call is known by a slot, the index of its
// promise's settle functions, and `settle(n, errors, events)` is what the native side calls with
// each batch (see "How a hit travels" in the README).

const { OP, decode } = require('./ops.js');

/** Numbers per result in the native `results`: the id, then the op's answer. */
const STRIDE = 7;

class InFlight {
  // Slots are reused once settled, so ids stay small.
  #resolvers = [];
  #rejecters = [];
  /** The op of each slot's call: how its answer becomes a result. */
  #ops = [];
  /** A step's (OP.takes) slot: its takes' ops, and the answers in so far (one result row each). */
  #steps = [];
  #freeSlots = [];
  #count = 0;
  #failures;
  /** The native `results` array (set by `attach`; of that type from the start, so the hot path sees one shape). */
  #results = new Float64Array(0);
  /** `hold(true)` keeps the native side (and the settle callback) alive while calls are in flight. */
  #hold = (held) => void held;
  #held = false;
  /** Promises waiting for the calls in flight to settle (close(), a resetAll()). */
  #drained = [];
  /** Lets the process go once idle; queued as a microtask, so a caller that calls again at once keeps the hold. */
  #release = () => {
    if (this.#count === 0 && this.#held) {
      this.#held = false;
      this.#hold(false);
    }
  };
  // One executor for every call's promise: it hands over the settle functions without a closure per call.
  #resolve;
  #reject;
  #capture = (resolve, reject) => {
    this.#resolve = resolve;
    this.#reject = reject;
  };
  /** Called by the native side with each batch of results. It holds it only weakly while idle, so it lives here. */
  settle = (n, errors, events) => this.#settle(n, errors, events);

  /** `failures`: the store's `Failures`, which counts each error and hears the connection events. */
  constructor(failures) {
    this.#failures = failures;
  }

  /** Wires the native store: its results array, and how to hold it while calls are in flight. */
  attach(results, hold) {
    this.#results = results;
    this.#hold = hold;
  }

  /** Calls sent and not yet settled. */
  get count() {
    return this.#count;
  }

  /** The slot the next call goes under; `free(slot)` if it could not be sent. */
  slot() {
    return this.#freeSlots.length > 0 ? this.#freeSlots.pop() : this.#resolvers.length;
  }

  free(slot) {
    // A slot never tracked past the end (a fresh one: slot() and slots() answer those from the end)
    // is not handed out again from the free list, or the end would hand it out a second time.
    if (slot < this.#resolvers.length) this.#freeSlots.push(slot);
  }

  /** `n` distinct slots, for a step's takes; `free` each if the step could not be sent. */
  slots(n) {
    const slots = [];
    let next = this.#resolvers.length;
    for (let i = 0; i < n; i++) slots.push(this.#freeSlots.length > 0 ? this.#freeSlots.pop() : next++);
    return slots;
  }

  /**
   * The promise of a step just sent, each take under its slot (`slots[i]`, its op `ops[i]`): `{ allowed,
   * answers }` once every take has settled, allowed when every take allowed. A failed step (its takes
   * all fail together) rejects once, its error counted once.
   */
  trackStep(slots, ops) {
    const answers = new Array(slots.length);
    let left = slots.length;
    let failed = false;
    return new Promise((resolve, reject) => {
      slots.forEach((slot, i) => {
        this.track(slot, ops[i]);
        this.#resolvers[slot] = (answer) => {
          answers[i] = answer;
          if (--left === 0 && !failed) resolve({ allowed: answers.every((a) => a.allowed), answers });
        };
        const rejectTake = (error) => {
          if (failed) return;
          failed = true;
          reject(this.#failures.failed(error));
        };
        rejectTake.uncounted = true;
        this.#rejecters[slot] = rejectTake;
      });
    });
  }

  /** The promise of the call of `op` just sent under `slot`; for a Redis step, `takes` are its takes' ops. */
  track(slot, op, takes) {
    this.#count++;
    if (!this.#held) {
      this.#held = true;
      this.#hold(true);
    }
    const promise = new Promise(this.#capture);
    this.#resolvers[slot] = this.#resolve;
    this.#rejecters[slot] = this.#reject;
    this.#ops[slot] = op;
    if (takes !== undefined) this.#steps[slot] = { takes, answers: [] };
    return promise;
  }

  /**
   * Counts a call that settles through a promise of its own (postgresStore's resetAll()) as in flight
   * until it settles, so that `drained()` waits for it too; answers that promise's outcome.
   */
  follow(pending) {
    this.#count++;
    return pending.finally(() => {
      this.#count--;
      this.#idle();
    });
  }

  /** Rejects the call tracked under `slot` that could not be sent, with `error` (counted). */
  fail(slot, error) {
    this.#take(this.#rejecters, slot)(this.#failures.failed(error));
    this.#idle();
  }

  /** Resolves once no call is in flight. */
  drained() {
    if (this.#count === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }

  /** Takes the settle function of a slot and frees the slot. */
  #take(settlers, slot) {
    const settle = settlers[slot];
    this.#resolvers[slot] = this.#rejecters[slot] = this.#steps[slot] = undefined;
    this.#freeSlots.push(slot);
    this.#count--;
    return settle;
  }

  /** The answer of a call of `op` that the native side ran at once: a batch's first row, after its id. */
  answered(op) {
    return this.#answer(op, 1);
  }

  /** The answer of a call of `op` whose numbers start at `at` in the results. */
  #answer(op, at) {
    const results = this.#results;
    return op === OP.hit ? { count: results[at], resetMs: results[at + 1] } : decode(op, results, at);
  }

  #settle(n, errors, events) {
    const results = this.#results;
    for (let i = 0; i < STRIDE * n; i += STRIDE) {
      const slot = results[i];
      const op = this.#ops[slot];
      if (op === OP.takes) {
        // A step: one row per take, in order, all under its slot; settled by the last.
        const step = this.#steps[slot];
        step.answers.push(decode(step.takes[step.answers.length], results, i + 1));
        if (step.answers.length < step.takes.length) continue;
        const answers = step.answers;
        this.#take(this.#resolvers, slot)({ allowed: answers.every((answer) => answer.allowed), answers });
        continue;
      }
      this.#take(this.#resolvers, slot)(this.#answer(op, i + 1));
    }
    if (errors !== undefined) {
      for (let i = 0; i < errors.length; i += 2) {
        const reject = this.#take(this.#rejecters, errors[i]);
        // A step's take counts its step's error once (see trackStep).
        reject(reject.uncounted === true ? errors[i + 1] : this.#failures.failed(errors[i + 1]));
      }
    }
    if (events !== undefined) for (const event of events) this.#failures.tell(event);
    this.#idle();
  }

  /** Once no call is in flight: lets the native side go (soon) and resolves what waits for that. */
  #idle() {
    if (this.#count === 0) {
      queueMicrotask(this.#release);
      if (this.#drained.length > 0) for (const resolve of this.#drained.splice(0)) resolve();
    }
  }
}

/**
 * Sends a step (its takes checked) through `send(numbers, keys)`, the native store's `takes`: seven
 * numbers per take (its slot, op, a, b, c, d and its key's length), the keys one after another.
 * Answers the step's promise (see trackStep); a step that could not be sent rejects, counted.
 */
function sendStep(inFlight, failures, send, takes) {
  const slots = inFlight.slots(takes.length);
  const numbers = [];
  let keys = '';
  takes.forEach((take, i) => {
    numbers.push(slots[i], take.op, take.a, take.b, take.c, take.d, take.key.length);
    keys += take.key;
  });
  try {
    send(numbers, keys);
  } catch (error) {
    for (const slot of slots) inFlight.free(slot);
    return Promise.reject(failures.failed(error));
  }
  return inFlight.trackStep(
    slots,
    takes.map((take) => take.op),
  );
}

module.exports = { InFlight, sendStep };
