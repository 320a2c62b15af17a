//! The operations on sqliteStore's rows: each the pure function of its
//! algorithm (`window`, `sliding`, `bucket`) applied to the row a key holds
//! for it, as memoryStore applies them to its counters and Redis's scripts to
//! their keys. A row is four integers, whose meaning its kind gives:
//!
//! | kind | `a` | `b` | `c` | `ends_at` |
//! | --- | --- | --- | --- | --- |
//! | 0, the fixed window | count | 0 | 0 | the window's end |
//! | 1, the sliding window | the current window's start | its count | the previous window's count | when the state stops counting |
//! | 2, the token bucket | tokens | the last refill | 0 | when it is full again |
//!
//! Times are µs since the epoch on the host's wall clock.

use crate::bucket::{self, Bucket, Params};
use crate::errors::Result;
use crate::ops::{taken_in, Answer, Args, Op};
use crate::sliding::{self, Sliding};
use crate::window::{self, Change, Counter};

const US_PER_MS: u64 = 1000;

/// A sliding window or a bucket counts until its end has passed; the fixed
/// window's rule (a window with under 1 ms left has ended, as Redis's PTTL
/// rounds) is read on this much later an end, as memoryStore does.
const KEPT_PAST_END_US: u64 = US_PER_MS - 1;

/// Which algorithm a row belongs to (the `kind` column).
pub fn kind(op: Op, args: &Args) -> u8 {
    match op {
        Op::Hit | Op::Consume | Op::Refund | Op::Ping | Op::Takes => 0,
        Op::SlidingIncrement | Op::SlidingDecrement | Op::SlidingConsume => 1,
        Op::Bucket => 2,
        Op::Unlink => args[0].clamp(0, 2) as u8,
    }
}

/// One row's integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub a: i64,
    pub b: i64,
    pub c: i64,
    pub ends_at: u64,
}

/// What an op does to its key's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowWrite {
    Keep,
    Put(Row),
    Drop,
}

/// A stored time as the column holds it (an integer of SQLite's, i64).
pub fn column_time(t: u64) -> i64 {
    t.min(i64::MAX as u64) as i64
}

/// Whether a row of `kind` still counts at `now`: one that does not is read
/// as no row (the sweeper deletes it later).
pub fn live(kind: u8, row: &Row, now: u64) -> bool {
    let end = match kind {
        0 => row.ends_at,
        _ => row.ends_at.saturating_add(KEPT_PAST_END_US),
    };
    let counter = Counter {
        count: 0,
        ends_at: end,
        long: false,
    };
    counter.reset_ms(now).is_some()
}

fn counter(row: Option<Row>) -> Option<Counter> {
    row.map(|r| Counter {
        count: r.a,
        ends_at: r.ends_at,
        long: false,
    })
}

fn fixed(change: Change<Counter>) -> RowWrite {
    match change {
        Change::Keep => RowWrite::Keep,
        Change::Drop => RowWrite::Drop,
        Change::Put(c) => RowWrite::Put(Row {
            a: c.count,
            b: 0,
            c: 0,
            ends_at: c.ends_at,
        }),
    }
}

fn sliding_state(row: Option<Row>) -> Option<Sliding> {
    row.map(|r| Sliding {
        start: r.a.max(0) as u64,
        current: r.b,
        previous: r.c,
        ends_at: r.ends_at,
    })
}

fn sliding_write(change: Change<Sliding>) -> RowWrite {
    match change {
        Change::Keep => RowWrite::Keep,
        Change::Drop => RowWrite::Drop,
        Change::Put(s) => RowWrite::Put(Row {
            a: column_time(s.start),
            b: s.current,
            c: s.previous,
            ends_at: s.ends_at,
        }),
    }
}

/// Runs `op` at `now` on the row its key holds (`stored`, already read as
/// none if it no longer counts): its answer and what to do with the row. On
/// error nothing may change.
pub fn apply(op: Op, a: &Args, stored: Option<Row>, now: u64) -> Result<(Answer, RowWrite)> {
    Ok(match op {
        Op::Hit => {
            let o = window::hit(counter(stored), now, a[0] as u64, a[1])?;
            (Answer::new(&[o.count, o.reset_ms as i64]), fixed(o.change))
        }
        Op::Consume => {
            let c = window::consume(counter(stored), now, a[0] as u64, a[1], a[2]);
            let values = [
                i64::from(c.allowed),
                c.count,
                c.remaining,
                c.reset_ms as i64,
                c.window as i64,
            ];
            (Answer::new(&values), fixed(c.change))
        }
        Op::Refund => {
            let r = window::refund_to(counter(stored), now, a[0], taken_in(a[1]));
            (Answer::new(&[r.count, r.reset_ms as i64]), fixed(r.change))
        }
        Op::SlidingIncrement | Op::SlidingDecrement => {
            let window_ms = a[0] as u64;
            let state = sliding_state(stored);
            let h = match op {
                Op::SlidingIncrement => sliding::increment(state, now, window_ms, a[1])?,
                _ => sliding::decrement(state, now, window_ms, a[1], taken_in(a[2])),
            };
            (
                Answer::new(&[h.count, h.reset_ms as i64, h.window as i64]),
                sliding_write(h.change),
            )
        }
        Op::SlidingConsume => {
            let c = sliding::consume(sliding_state(stored), now, a[0] as u64, a[1], a[2]);
            let values = [
                i64::from(c.allowed),
                c.count,
                c.remaining,
                c.reset_ms as i64,
                c.retry_ms as i64,
                c.window as i64,
            ];
            (Answer::new(&values), sliding_write(c.change))
        }
        Op::Bucket => {
            let p = Params {
                capacity: a[0],
                refill: a[1],
                interval_ms: a[2] as u64,
            };
            let state = stored.map(|r| Bucket {
                tokens: r.a,
                refilled_at: r.b.max(0) as u64,
                ends_at: r.ends_at,
            });
            let t = bucket::take(state, now, &p, a[3]);
            let write = match t.change {
                Change::Keep => RowWrite::Keep,
                Change::Drop => RowWrite::Drop,
                Change::Put(b) => RowWrite::Put(Row {
                    a: b.tokens,
                    b: column_time(b.refilled_at),
                    c: 0,
                    ends_at: b.ends_at,
                }),
            };
            let values = [
                i64::from(t.allowed),
                t.remaining,
                t.retry_ms as i64,
                t.reset_ms as i64,
            ];
            (Answer::new(&values), write)
        }
        Op::Ping => (Answer::new(&[1]), RowWrite::Keep),
        // A step is not one op (`Op::check` refuses it).
        Op::Takes => {
            return Err(crate::errors::Error::InvalidRange(
                "several takes go as one step, not as one op",
            ))
        }
        Op::Unlink => (Answer::new(&[i64::from(stored.is_some())]), RowWrite::Drop),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::Error;

    const MS: u64 = 1000;
    const T0: u64 = 1_700_000_000_000 * MS;

    /// Runs `op` on one row through `apply`, as the store does.
    fn run(row: &mut Option<Row>, op: Op, n: [f64; 4], now: u64) -> Result<Vec<i64>> {
        let args = op.check(n)?;
        let k = kind(op, &args);
        let stored = row.filter(|r| live(k, r, now));
        let (answer, write) = apply(op, &args, stored, now)?;
        match write {
            RowWrite::Keep => {}
            RowWrite::Put(r) => *row = Some(r),
            RowWrite::Drop => *row = None,
        }
        Ok(answer.values[..answer.len].to_vec())
    }

    #[test]
    fn hits_count_in_a_window_and_a_new_one_opens_after_it() {
        let mut row = None;
        let hit = |row: &mut Option<Row>, n: f64, at: u64| {
            run(row, Op::Hit, [1_000.0, n, 0.0, 0.0], at).unwrap()
        };
        assert_eq!(hit(&mut row, 1.0, T0), [1, 1_000]);
        assert_eq!(hit(&mut row, 2.0, T0 + 400 * MS), [3, 600]);
        assert_eq!(hit(&mut row, 0.0, T0 + 999 * MS), [3, 1]);
        assert_eq!(hit(&mut row, 0.0, T0 + 1_000 * MS), [0, 1_000]);
        assert_eq!(hit(&mut row, 1.0, T0 + 1_000 * MS), [1, 1_000]);
    }

    #[test]
    fn a_count_past_the_safe_range_changes_nothing() {
        let mut row = None;
        run(&mut row, Op::Hit, [1_000.0, 9e15, 0.0, 0.0], T0).unwrap();
        let before = row;
        let err = run(&mut row, Op::Hit, [1_000.0, 9e15, 0.0, 0.0], T0).unwrap_err();
        assert_eq!(err, Error::CountOutOfRange);
        assert_eq!(row, before);
    }

    #[test]
    fn consume_refund_and_the_window_they_name() {
        let mut row = None;
        let taken = run(&mut row, Op::Consume, [1_000.0, 2.0, 2.0, 0.0], T0).unwrap();
        assert_eq!(taken[..4], [1, 2, 0, 1_000]);
        let refused = run(&mut row, Op::Consume, [1_000.0, 2.0, 1.0, 0.0], T0).unwrap();
        assert_eq!(refused[..4], [0, 2, 0, 1_000]);
        let window = taken[4] as f64;
        // Naming another window gives nothing back.
        let other = run(&mut row, Op::Refund, [1.0, window + 1.0, 0.0, 0.0], T0).unwrap();
        assert_eq!(other, [0, 0]);
        let back = run(&mut row, Op::Refund, [1.0, window, 0.0, 0.0], T0).unwrap();
        assert_eq!(back, [1, 1_000]);
    }

    #[test]
    fn the_sliding_window_weighs_the_previous_window() {
        let mut row = None;
        let start = T0 - T0 % (1_000 * MS);
        let inc = |row: &mut Option<Row>, n: f64, at: u64| {
            run(row, Op::SlidingIncrement, [1_000.0, n, 0.0, 0.0], at).unwrap()
        };
        assert_eq!(inc(&mut row, 4.0, start)[..2], [4, 1_000]);
        // Half the previous window is inside: 4 * 0.5 + 1.
        assert_eq!(inc(&mut row, 1.0, start + 1_500 * MS)[..2], [3, 500]);
        // Two windows on, nothing counts: the row is read as none (the sweeper deletes it).
        assert_eq!(inc(&mut row, 0.0, start + 3_000 * MS)[..2], [0, 1_000]);
        assert!(!live(1, &row.unwrap(), start + 3_000 * MS));
        assert!(live(1, &row.unwrap(), start + 2_999 * MS));
    }

    #[test]
    fn the_bucket_refills_whole_intervals() {
        let mut row = None;
        let take = |row: &mut Option<Row>, cost: f64, at: u64| {
            run(row, Op::Bucket, [3.0, 1.0, 100.0, cost], at).unwrap()
        };
        assert_eq!(take(&mut row, 3.0, T0), [1, 0, 0, 300]);
        assert_eq!(take(&mut row, 1.0, T0 + 50 * MS), [0, 0, 50, 250]);
        assert_eq!(take(&mut row, 1.0, T0 + 100 * MS), [1, 0, 0, 300]);
        // Full again: no row counts.
        assert!(!live(2, &row.unwrap(), T0 + 400 * MS));
    }

    #[test]
    fn unlink_answers_whether_a_row_counted() {
        let mut row = None;
        run(&mut row, Op::Hit, [1_000.0, 1.0, 0.0, 0.0], T0).unwrap();
        assert_eq!(
            run(&mut row, Op::Unlink, [0.0, 0.0, 0.0, 0.0], T0).unwrap(),
            [1]
        );
        assert_eq!(row, None);
        assert_eq!(kind(Op::Unlink, &[2, 0, 0, 0]), 2);
    }
}
