//! The operations beyond hit on the memory table: each the pure function of
//! its algorithm (`window`, `sliding`, `bucket`) applied under one shard lock.
//!
//! Every state is kept in the table's own counters (a count and an end), so
//! each costs what a fixed-window counter does: the sliding window as three
//! (the current and the previous window's counts, and the windowMs it was
//! written with, all ending when the state stops counting; its start is that
//! end less one window of its own or two), kept and dropped together; the
//! token bucket as one (the tokens; the last refill is its end less the time
//! to refill what is missing). Their keys differ from the fixed window's in
//! the low half of the hash only, so a key's states share its shard (and its
//! lock), and switching an algorithm never misreads a counter.

use super::{KeyHash, Table};
use crate::bucket::{self, Bucket, Params};
use crate::errors::Result;
use crate::ops::{taken_in, Answer, Args, Op};
use crate::sliding::{self, Sliding};
use crate::window::{self, Change, Counter, SHORT_WINDOW_MS};

const SLIDING_CURRENT: u128 = 0x9e37_79b9_7f4a_7c15;
const SLIDING_PREVIOUS: u128 = 0xc2b2_ae3d_27d4_eb4f;
/// The sliding window's own windowMs, so that a read with another one finds
/// the state's start as Redis stores it.
const SLIDING_WINDOW: u128 = 0x27d4_eb2f_1656_67c5;
const BUCKET: u128 = 0x1656_67b1_9e37_79f9;
const US_PER_MS: u64 = 1000;

/// A sliding window or a bucket counts until its end has passed, where the
/// table reads a counter with under 1 ms left as ended (a fixed window's
/// rule, as Redis's PTTL rounds): their counters are stored this much later
/// than their ends, so that the table drops them exactly when they stop
/// counting, as Redis expires them.
const KEPT_PAST_END_US: u64 = US_PER_MS - 1;

fn stored_end(ends_at: u64) -> u64 {
    ends_at.saturating_add(KEPT_PAST_END_US)
}

fn state_end(c: &Counter) -> u64 {
    c.ends_at.saturating_sub(KEPT_PAST_END_US)
}

/// What an op does to one of its key's counters.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    Keep,
    /// Store this counter, indexed as a window of this many ms.
    Put(Counter, u64),
    Drop,
}

/// The keys of the counters an op reads and writes (one to three).
pub(super) fn keys(key: KeyHash, op: Op, args: &Args) -> ([KeyHash; 3], usize) {
    let sliding = (
        [
            key ^ SLIDING_CURRENT,
            key ^ SLIDING_PREVIOUS,
            key ^ SLIDING_WINDOW,
        ],
        3,
    );
    match op {
        Op::Hit | Op::Consume | Op::Refund | Op::Ping | Op::Takes => ([key; 3], 1),
        Op::SlidingIncrement | Op::SlidingDecrement | Op::SlidingConsume => sliding,
        Op::Bucket => ([key ^ BUCKET; 3], 1),
        Op::Unlink => match args[0] {
            0 => ([key; 3], 1),
            1 => sliding,
            _ => ([key ^ BUCKET; 3], 1),
        },
    }
}

/// The keys that may hold the rest of a sliding state, one of whose counters
/// is held under `key`: whichever of the three it is, two of these are the
/// others (the third, like all three for any other counter, is held only by
/// a 2^-128 chance).
pub(super) fn partners(key: KeyHash) -> [KeyHash; 3] {
    [
        key ^ SLIDING_CURRENT ^ SLIDING_PREVIOUS,
        key ^ SLIDING_CURRENT ^ SLIDING_WINDOW,
        key ^ SLIDING_PREVIOUS ^ SLIDING_WINDOW,
    ]
}

fn write(change: Change<Counter>, window_ms: u64) -> Write {
    match change {
        Change::Keep => Write::Keep,
        Change::Put(c) => Write::Put(c, window_ms),
        Change::Drop => Write::Drop,
    }
}

/// The sliding window's state from its counters, its start found with the
/// windowMs it was written with (not the call's), as Redis stores it.
fn sliding_state(held: [Option<Counter>; 3]) -> Option<Sliding> {
    held[0].or(held[1])?;
    let written = held[2]?;
    let ends_at = state_end(&written);
    let (current, previous) = (
        held[0].map_or(0, |c| c.count),
        held[1].map_or(0, |c| c.count),
    );
    let windows = if current == 0 { 1 } else { 2 };
    let window_us = (written.count as u64).saturating_mul(US_PER_MS);
    Some(Sliding {
        start: ends_at.saturating_sub(windows * window_us),
        current,
        previous,
        ends_at,
    })
}

/// The three counters of a sliding window's state.
fn sliding_writes(change: Change<Sliding>, window_ms: u64) -> [Write; 3] {
    let long = window_ms > SHORT_WINDOW_MS;
    let counter = |count: i64, ends_at| match count {
        0 => Write::Drop,
        count => Write::Put(
            Counter {
                count,
                ends_at: stored_end(ends_at),
                long,
            },
            window_ms,
        ),
    };
    match change {
        Change::Keep => [Write::Keep; 3],
        Change::Drop => [Write::Drop; 3],
        Change::Put(s) => [
            counter(s.current, s.ends_at),
            counter(s.previous, s.ends_at),
            counter(window_ms as i64, s.ends_at),
        ],
    }
}

/// The time a bucket takes to fill from empty, in ms: what it is indexed by.
fn fill_ms(p: &Params) -> u64 {
    let refills = (p.capacity + p.refill - 1) / p.refill;
    refills as u64 * p.interval_ms
}

fn bucket_state(held: Option<Counter>, p: &Params) -> Option<Bucket> {
    let c = held?;
    let missing = (p.capacity - c.count).max(0);
    let refills = (missing + p.refill - 1) / p.refill;
    let to_full = refills as u64 * p.interval_ms * US_PER_MS;
    let ends_at = state_end(&c);
    Some(Bucket {
        tokens: c.count,
        refilled_at: ends_at.saturating_sub(to_full),
        ends_at,
    })
}

/// The op at `now` on the counters it reads: its answer and its writes.
pub(super) fn apply(
    op: Op,
    a: &Args,
    held: [Option<Counter>; 3],
    now: u64,
) -> Result<(Answer, [Write; 3])> {
    let keep = Write::Keep;
    Ok(match op {
        Op::Hit => {
            let o = window::hit(held[0], now, a[0] as u64, a[1])?;
            (
                Answer::new(&[o.count, o.reset_ms as i64]),
                [write(o.change, a[0] as u64), keep, keep],
            )
        }
        Op::Consume => {
            let c = window::consume(held[0], now, a[0] as u64, a[1], a[2]);
            let values = [
                i64::from(c.allowed),
                c.count,
                c.remaining,
                c.reset_ms as i64,
                c.window as i64,
            ];
            (
                Answer::new(&values),
                [write(c.change, a[0] as u64), keep, keep],
            )
        }
        Op::Refund => {
            let r = window::refund_to(held[0], now, a[0], taken_in(a[1]));
            let window_ms = held[0].map_or(0, |c| c.ends_at.saturating_sub(now) / US_PER_MS);
            (
                Answer::new(&[r.count, r.reset_ms as i64]),
                [write(r.change, window_ms), keep, keep],
            )
        }
        Op::SlidingIncrement | Op::SlidingDecrement => {
            let window_ms = a[0] as u64;
            let stored = sliding_state(held);
            let h = match op {
                Op::SlidingIncrement => sliding::increment(stored, now, window_ms, a[1])?,
                _ => sliding::decrement(stored, now, window_ms, a[1], taken_in(a[2])),
            };
            (
                Answer::new(&[h.count, h.reset_ms as i64, h.window as i64]),
                sliding_writes(h.change, window_ms),
            )
        }
        Op::SlidingConsume => {
            let window_ms = a[0] as u64;
            let c = sliding::consume(sliding_state(held), now, window_ms, a[1], a[2]);
            let values = [
                i64::from(c.allowed),
                c.count,
                c.remaining,
                c.reset_ms as i64,
                c.retry_ms as i64,
                c.window as i64,
            ];
            (Answer::new(&values), sliding_writes(c.change, window_ms))
        }
        Op::Bucket => {
            let p = Params {
                capacity: a[0],
                refill: a[1],
                interval_ms: a[2] as u64,
            };
            let t = bucket::take(bucket_state(held[0], &p), now, &p, a[3]);
            let fill = fill_ms(&p);
            let change = match t.change {
                Change::Keep => Write::Keep,
                Change::Drop => Write::Drop,
                Change::Put(b) => Write::Put(
                    Counter {
                        count: b.tokens,
                        ends_at: stored_end(b.ends_at),
                        long: fill > SHORT_WINDOW_MS,
                    },
                    fill,
                ),
            };
            let values = [
                i64::from(t.allowed),
                t.remaining,
                t.retry_ms as i64,
                t.reset_ms as i64,
            ];
            (Answer::new(&values), [change, keep, keep])
        }
        Op::Ping => (Answer::new(&[1]), [keep; 3]),
        // A step is not one op (`Op::check` refuses it).
        Op::Takes => {
            return Err(crate::errors::Error::InvalidRange(
                "several takes go as one step, not as one op",
            ))
        }
        Op::Unlink => {
            let removed = held.iter().flatten().count() as i64;
            (Answer::new(&[removed]), [Write::Drop; 3])
        }
    })
}

impl Table {
    /// Runs `op` on `key` under the key's shard lock, at the time `clock`
    /// reads once it is held. On error nothing changed.
    pub fn run(
        &self,
        key: KeyHash,
        clock: impl Fn() -> u64,
        op: Op,
        args: &Args,
    ) -> Result<Answer> {
        if op == Op::Hit {
            // The contract's hit keeps its own path, measured on every request.
            let o = self.hit(key, clock, args[0] as u64, args[1])?;
            return Ok(Answer::new(&[o.count, o.reset_ms as i64]));
        }
        let (keys, n) = keys(key, op, args);
        let keys = &keys[..n];
        let s = Self::shard_of(key);
        let mut counted = false;
        loop {
            let mut shard = self.lock(s)?;
            if !std::mem::replace(&mut counted, true) {
                shard.tally.calls += 1;
            }
            let now = shard.tick(clock());
            let mut held = [None; 3];
            for (h, &k) in held.iter_mut().zip(keys) {
                // An ended counter the sweeper has not dropped yet counts as none.
                *h = shard
                    .find(k)
                    .map(|id| shard.get(id))
                    .filter(|c| c.reset_ms(now).is_some());
            }
            let (answer, writes) = apply(op, args, held, now)?;
            let new = keys
                .iter()
                .zip(&writes)
                .filter(|&(&k, w)| matches!(w, Write::Put(..)) && shard.find(k).is_none())
                .count();
            if new > 0 && !self.reserve_n(new) {
                // Release the shard before touching another.
                drop(shard);
                self.make_room(&clock)?;
                continue;
            }
            let mut reindexed = false;
            for (&k, w) in keys.iter().zip(writes) {
                match (shard.find(k), w) {
                    (_, Write::Keep) | (None, Write::Drop) => {}
                    (Some(id), Write::Put(c, window_ms)) => {
                        reindexed |= shard.put(id, c, window_ms)
                    }
                    (None, Write::Put(c, window_ms)) => {
                        shard.insert(k, c, window_ms);
                        reindexed = true;
                    }
                    (Some(id), Write::Drop) => {
                        shard.remove(id);
                        self.len.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        reindexed = true;
                    }
                }
            }
            if reindexed {
                self.publish(s, &shard);
            }
            return Ok(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::Error;
    use proptest::prelude::*;

    const MS: u64 = 1000;

    fn run(t: &Table, key: KeyHash, now: u64, op: Op, args: [f64; 4]) -> Vec<i64> {
        let args = op.check(args).unwrap();
        let a = t.run(key, || now, op, &args).unwrap();
        a.values[..a.len].to_vec()
    }

    #[test]
    fn consume_and_refund_share_hits_counter() {
        let t = Table::new(10);
        t.hit(1, || 0, 60_000, 3).unwrap();
        assert_eq!(
            run(&t, 1, 0, Op::Consume, [60_000.0, 4.0, 1.0, 0.0]),
            [1, 4, 0, 60_000, 60_000 * MS as i64]
        );
        assert_eq!(
            run(&t, 1, 0, Op::Consume, [60_000.0, 4.0, 1.0, 0.0]),
            [0, 4, 0, 60_000, 60_000 * MS as i64]
        );
        assert_eq!(
            run(&t, 1, MS, Op::Refund, [9.0, 0.0, 0.0, 0.0]),
            [0, 59_999]
        );
        assert_eq!(run(&t, 2, 0, Op::Refund, [1.0, 0.0, 0.0, 0.0]), [0, 0]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn the_sliding_window_lives_in_three_counters_and_agrees_with_its_rules() {
        let t = Table::new(10);
        let w = 1_000u64;
        // At the start of a window, then in the next one, 3/4 of the way in... 1/4 left.
        let start = 10 * w * MS;
        assert_eq!(
            run(
                &t,
                7,
                start,
                Op::SlidingIncrement,
                [w as f64, 4.0, 0.0, 0.0]
            ),
            [4, 1_000, (start + w * MS) as i64]
        );
        let later = start + w * MS + 750 * MS;
        let stored = match sliding::increment(None, start, w, 4).unwrap().change {
            Change::Put(s) => Some(s),
            _ => None,
        };
        let want = sliding::increment(stored, later, w, 0).unwrap();
        assert_eq!(
            run(
                &t,
                7,
                later,
                Op::SlidingIncrement,
                [w as f64, 0.0, 0.0, 0.0]
            ),
            [want.count, want.reset_ms as i64, want.window as i64]
        );
        assert_eq!(
            t.len(),
            2,
            "one window's count and the windowMs are two counters"
        );
        assert_eq!(
            run(&t, 7, later, Op::SlidingConsume, [w as f64, 3.0, 2.0, 0.0])[0],
            1
        );
        assert_eq!(t.len(), 3);
        // The fixed window of the same key is apart.
        assert_eq!(t.hit(7, || later, 60_000, 0).unwrap().count, 0);
        assert_eq!(run(&t, 7, later, Op::Unlink, [1.0, 0.0, 0.0, 0.0]), [3]);
        assert!(t.is_empty());
    }

    #[test]
    fn the_bucket_lives_in_one_counter() {
        let t = Table::new(10);
        let take = |now, cost: f64| run(&t, 3, now, Op::Bucket, [3.0, 1.0, 100.0, cost]);
        assert_eq!(take(0, 3.0), [1, 0, 0, 300]);
        assert_eq!(take(50 * MS, 1.0), [0, 0, 50, 250]);
        assert_eq!(take(100 * MS, 1.0), [1, 0, 0, 300]);
        assert_eq!(t.len(), 1);
        assert_eq!(take(400 * MS, 0.0), [1, 3, 0, 0], "full again");
    }

    #[test]
    fn new_states_need_room_and_a_full_table_refuses_budgets() {
        let t = Table::new(1);
        let day = 24.0 * SHORT_WINDOW_MS as f64;
        run(&t, 1, 0, Op::Consume, [day, 10.0, 1.0, 0.0]);
        let args = Op::SlidingIncrement.check([day, 1.0, 0.0, 0.0]).unwrap();
        assert_eq!(
            t.run(2, || 0, Op::SlidingIncrement, &args),
            Err(Error::StoreFull(1))
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_full_table_drops_a_sliding_state_whole() {
        let t = Table::new(3);
        let w = 1_000.0;
        let start = 10 * 1_000 * MS;
        run(
            &t,
            4,
            start + 100 * MS,
            Op::SlidingIncrement,
            [w, 6.0, 0.0, 0.0],
        );
        let now = start + 1_010 * MS;
        let whole = run(&t, 4, now, Op::SlidingIncrement, [w, 1.0, 0.0, 0.0])[0];
        // Two new keys need room: the state is the soonest to end.
        t.hit(5, || now, 60_000, 1).unwrap();
        t.hit(6, || now, 60_000, 1).unwrap();
        let read = run(&t, 4, now, Op::SlidingIncrement, [w, 0.0, 0.0, 0.0])[0];
        assert!(read == 0 || read == whole, "read {read}, whole {whole}");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_sliding_state_is_read_with_the_start_it_was_written_with() {
        let t = Table::new(10);
        let start = 10 * 1_000 * MS;
        run(
            &t,
            4,
            start + 100 * MS,
            Op::SlidingIncrement,
            [1_000.0, 5.0, 0.0, 0.0],
        );
        // 500 ms later on a 100 ms grid: its start lines up with neither window.
        let later = start + 600 * MS;
        assert_eq!(
            run(&t, 4, later, Op::SlidingIncrement, [100.0, 0.0, 0.0, 0.0])[0],
            0
        );
        // At 200 ms, a 200 ms grid's previous window starts where it does.
        let t = Table::new(10);
        run(
            &t,
            4,
            start + 100 * MS,
            Op::SlidingIncrement,
            [1_000.0, 5.0, 0.0, 0.0],
        );
        let at = start + 250 * MS;
        let stored = Some(Sliding {
            start,
            previous: 0,
            current: 5,
            ends_at: start + 2_000 * MS,
        });
        let want = sliding::increment(stored, at, 200, 0).unwrap().count;
        assert_eq!(
            run(&t, 4, at, Op::SlidingIncrement, [200.0, 0.0, 0.0, 0.0])[0],
            want
        );
        assert!(want > 0);
    }

    /// The pure functions with their state kept whole, as Redis keeps it.
    #[derive(Default)]
    struct StatesModel {
        sliding: Option<Sliding>,
        bucket: Option<Bucket>,
    }

    fn kept<S>(stored: &mut Option<S>, change: Change<S>) {
        match change {
            Change::Keep => {}
            Change::Put(s) => *stored = Some(s),
            Change::Drop => *stored = None,
        }
    }

    impl StatesModel {
        fn run(&mut self, now: u64, op: Op, a: &Args) -> Vec<i64> {
            // Redis expires a state once it counts nothing under its own windowMs.
            if self.sliding.is_some_and(|s| s.ends_at <= now) {
                self.sliding = None;
            }
            match op {
                Op::SlidingIncrement | Op::SlidingDecrement => {
                    let h = match op {
                        Op::SlidingIncrement => {
                            sliding::increment(self.sliding, now, a[0] as u64, a[1]).unwrap()
                        }
                        _ => sliding::decrement(self.sliding, now, a[0] as u64, a[1], None),
                    };
                    kept(&mut self.sliding, h.change);
                    vec![h.count, h.reset_ms as i64, h.window as i64]
                }
                Op::SlidingConsume => {
                    let c = sliding::consume(self.sliding, now, a[0] as u64, a[1], a[2]);
                    kept(&mut self.sliding, c.change);
                    vec![
                        i64::from(c.allowed),
                        c.count,
                        c.remaining,
                        c.reset_ms as i64,
                        c.retry_ms as i64,
                        c.window as i64,
                    ]
                }
                _ => {
                    let p = Params {
                        capacity: a[0],
                        refill: a[1],
                        interval_ms: a[2] as u64,
                    };
                    let t = bucket::take(self.bucket, now, &p, a[3]);
                    kept(&mut self.bucket, t.change);
                    vec![
                        i64::from(t.allowed),
                        t.remaining,
                        t.retry_ms as i64,
                        t.reset_ms as i64,
                    ]
                }
            }
        }
    }

    proptest! {
        /// The table keeps the sliding window in two counters and the bucket
        /// in one: it must answer as the whole states do, step by step.
        #[test]
        fn the_table_agrees_with_whole_states(
            steps in prop::collection::vec((0u8..4, 0u64..900_000, 0i64..4, 0usize..4), 1..120)
        ) {
            let table = Table::new(100);
            let mut model = StatesModel::default();
            let mut now = 5_000_000;
            for (kind, step, n, w) in steps {
                // Windows whose grids line up now and then, and one that never does.
                let w = [400.0, 200.0, 800.0, 300.0][w];
                now += step;
                if step % 5 == 0 {
                    table.sweep(|| now);
                }
                let (op, args) = match kind {
                    0 => (Op::SlidingIncrement, [w, n as f64, 0.0, 0.0]),
                    1 => (Op::SlidingDecrement, [w, n as f64, 0.0, 0.0]),
                    2 => (Op::SlidingConsume, [w, 5.0, n as f64, 0.0]),
                    _ => (Op::Bucket, [4.0, 1.0, 150.0, n as f64]),
                };
                let args = op.check(args).unwrap();
                let got = table.run(9, || now, op, &args).unwrap();
                prop_assert_eq!(got.values[..got.len].to_vec(), model.run(now, op, &args), "{:?} at {}", op, now);
            }
        }
    }
}
