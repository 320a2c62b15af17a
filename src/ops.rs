//! The operations a store runs for JavaScript, as one shape every store and
//! transport shares: an [`Op`], its checked numbers ([`Args`]), and its
//! answer ([`Answer`], up to [`ANSWER_LEN`] integers, whose meaning the op
//! gives). How Redis runs each op (its Lua script, key suffix and ARGV) is
//! in `redis::scripts`.

use crate::errors::{Error, Result};
use crate::window::MAX_SAFE;
use crate::{bucket, sliding, window};

/// An operation, as JavaScript names it by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `hit(key, windowMs, amount)` → `[count, resetMs]`.
    Hit,
    /// `consume(key, { limit, windowMs, cost })` →
    /// `[allowed, count, remaining, resetMs, window]`.
    Consume,
    /// `refund(key, amount, { window })` → `[count, resetMs]` (`resetMs` 0:
    /// no open window, or not the one named).
    Refund,
    /// `slidingWindow.increment(key, windowMs, amount)` → `[count, resetMs, window]`.
    SlidingIncrement,
    /// `slidingWindow.decrement(key, windowMs, amount, { window })` →
    /// `[count, resetMs, window]`.
    SlidingDecrement,
    /// `slidingWindow.consume(key, { limit, windowMs, cost })` →
    /// `[allowed, count, remaining, resetMs, retryMs, window]`.
    SlidingConsume,
    /// `tokenBucket(key, { capacity, refill, intervalMs, cost })` →
    /// `[allowed, remaining, retryMs, resetMs]`.
    Bucket,
    /// Removes one of a key's states (`a` names which: 0 fixed, 1 sliding,
    /// 2 bucket) → `[removed]`.
    Unlink,
    /// `ping()`: one `PING` (no key is touched) → `[1]`.
    Ping,
    /// Several takes as one step (see `redis::step`): its key is the
    /// step's blob, and it answers each take's answer, in order.
    Takes,
}

/// An op's numbers, checked: integers in the ranges the op allows.
pub type Args = [i64; 4];

/// The most integers an op answers.
pub const ANSWER_LEN: usize = 6;

/// A give-back's window argument: the id its take answered, or `None` (sent
/// as 0: an id is a window's end, above 0) for a give-back naming no window.
pub fn taken_in(arg: i64) -> Option<u64> {
    (arg > 0).then_some(arg as u64)
}

/// An op's answer: its integers, `len` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub values: [i64; ANSWER_LEN],
    pub len: usize,
}

impl Answer {
    pub fn new(values: &[i64]) -> Answer {
        let mut all = [0; ANSWER_LEN];
        all[..values.len()].copy_from_slice(values);
        Answer {
            values: all,
            len: values.len(),
        }
    }
}

/// The most takes one step of a limiter's several limits holds, on every store.
pub const MAX_TAKES: usize = 16;

/// Checks that ops can be one step: 1 to [`MAX_TAKES`] takes, each
/// [`Op::is_take`].
pub fn check_step(mut ops: impl ExactSizeIterator<Item = Op>) -> crate::errors::Result<()> {
    let n = ops.len();
    if n == 0 || n > MAX_TAKES || !ops.all(Op::is_take) {
        return Err(crate::errors::Error::InvalidRange(
            "a step holds 1 to 16 takes, each a consume or a token bucket",
        ));
    }
    Ok(())
}

impl Op {
    /// Whether this op can be a take of a step: it answers `allowed` first,
    /// and a refusal changes nothing.
    pub fn is_take(self) -> bool {
        matches!(self, Op::Consume | Op::SlidingConsume | Op::Bucket)
    }

    /// Every op, in the order of its number: the one list that numbers ops,
    /// for the native side and (through the binding's `opNames()`) the JS face.
    pub const ALL: [Op; 10] = [
        Op::Hit,
        Op::Consume,
        Op::Refund,
        Op::SlidingIncrement,
        Op::SlidingDecrement,
        Op::SlidingConsume,
        Op::Bucket,
        Op::Unlink,
        Op::Ping,
        Op::Takes,
    ];

    /// The op's name on the JS side (`lib/ops.js`'s `OP`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Hit => "hit",
            Op::Consume => "consume",
            Op::Refund => "refund",
            Op::SlidingIncrement => "slidingIncrement",
            Op::SlidingDecrement => "slidingDecrement",
            Op::SlidingConsume => "slidingConsume",
            Op::Bucket => "tokenBucket",
            Op::Unlink => "unlink",
            Op::Ping => "ping",
            Op::Takes => "takes",
        }
    }

    /// The op's number: its place in [`Op::ALL`].
    pub fn code(self) -> u8 {
        Op::ALL.iter().position(|&op| op == self).unwrap_or(0) as u8
    }

    pub fn from_code(code: f64) -> Option<Op> {
        if code.fract() != 0.0 || code < 0.0 {
            return None;
        }
        Op::ALL.get(code as usize).copied()
    }

    /// Checks the op's numbers as JavaScript gave them (the JS face checks
    /// them first, with messages naming each; this keeps the core safe on
    /// its own). Unused ones are ignored.
    pub fn check(self, n: [f64; 4]) -> Result<Args> {
        Ok(match self {
            Op::Hit => {
                let (window_ms, amount) = window::check(n[0], n[1])?;
                [window_ms as i64, amount, 0, 0]
            }
            Op::Consume => {
                let (window_ms, limit, cost) = window::check_consume(n[0], n[1], n[2])?;
                [window_ms as i64, limit, cost, 0]
            }
            Op::Refund => [window::check_refund(n[0])?, check_window(n[1])?, 0, 0],
            Op::SlidingIncrement => {
                let (window_ms, amount) = sliding::check(n[0], n[1])?;
                [window_ms as i64, amount, 0, 0]
            }
            Op::SlidingDecrement => {
                let (window_ms, amount) = sliding::check(n[0], n[1])?;
                [window_ms as i64, amount, check_window(n[2])?, 0]
            }
            Op::SlidingConsume => {
                let (window_ms, limit, cost) = sliding::check_consume(n[0], n[1], n[2])?;
                [window_ms as i64, limit, cost, 0]
            }
            Op::Bucket => {
                let (p, cost) = bucket::check(n[0], n[1], n[2], n[3])?;
                [p.capacity, p.refill, p.interval_ms as i64, cost]
            }
            Op::Unlink => match n[0] {
                0.0 => [0; 4],
                1.0 => [1, 0, 0, 0],
                2.0 => [2, 0, 0, 0],
                _ => return Err(Error::InvalidRange("unknown state to remove")),
            },
            Op::Ping => [0; 4],
            Op::Takes => {
                return Err(Error::InvalidRange(
                    "several takes go as one step, not as one op",
                ))
            }
        })
    }

    /// How many integers the op answers.
    pub fn answer_len(self) -> usize {
        match self {
            Op::Hit | Op::Refund => 2,
            Op::SlidingIncrement | Op::SlidingDecrement => 3,
            Op::Bucket => 4,
            Op::Consume => 5,
            Op::SlidingConsume => 6,
            Op::Unlink | Op::Ping => 1,
            Op::Takes => 0,
        }
    }

    /// Checks a script's integers: the right count, each a safe integer
    /// (and a hit's resetMs above 0, as the contract promises).
    pub fn answer(self, values: &[i64]) -> Result<Answer> {
        let shape_ok = values.len() == self.answer_len()
            && values.iter().all(|v| v.abs() <= MAX_SAFE)
            && (self != Op::Hit || values[1] > 0);
        if !shape_ok {
            return Err(Error::Redis(
                "a script gave an answer of the wrong shape".into(),
            ));
        }
        Ok(Answer::new(values))
    }
}

/// A give-back's window argument: 0 (none named) or an id, a safe integer.
fn check_window(n: f64) -> Result<i64> {
    window::non_negative_safe_integer(n).ok_or(Error::InvalidRange(
        "window must be a window id a take answered (a positive safe integer)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_name_ops_and_checks_refuse_bad_numbers() {
        assert_eq!(Op::from_code(0.0), Some(Op::Hit));
        assert_eq!(Op::from_code(7.0), Some(Op::Unlink));
        assert_eq!(Op::from_code(8.0), Some(Op::Ping));
        assert_eq!(Op::from_code(9.0), Some(Op::Takes));
        assert_eq!(Op::from_code(10.0), None);
        assert_eq!(Op::from_code(1.5), None);
        for bad in [
            -1.0,
            -0.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
        ] {
            assert_eq!(Op::from_code(bad), None, "{bad}");
        }
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(op.code()), i);
            assert_eq!(Op::from_code(i as f64), Some(op));
        }
        assert_eq!(
            Op::Hit.check([60_000.0, -3.0, 0.0, 0.0]),
            Ok([60_000, -3, 0, 0])
        );
        assert!(Op::Consume.check([60_000.0, -1.0, 1.0, 0.0]).is_err());
        assert!(Op::Refund.check([-1.0, 0.0, 0.0, 0.0]).is_err());
        assert!(Op::Bucket.check([10.0, 1.0, 0.0, 1.0]).is_err());
        assert!(Op::Unlink.check([3.0, 0.0, 0.0, 0.0]).is_err());
    }

    #[test]
    fn answers_are_checked() {
        assert_eq!(Op::Hit.answer(&[3, 10]).unwrap().values[..2], [3, 10]);
        assert!(Op::Hit.answer(&[3, 0]).is_err());
        assert!(Op::Hit.answer(&[3]).is_err());
        assert!(Op::Consume.answer(&[1, MAX_SAFE + 1, 0, 5, 7]).is_err());
        assert!(Op::Consume.answer(&[1, 1, 0, 5]).is_err());
        assert_eq!(
            Op::SlidingConsume.answer(&[0, 5, 0, 10, 3, 7]).unwrap().len,
            6
        );
    }

    #[test]
    fn give_backs_name_a_window_or_none() {
        assert_eq!(Op::Refund.check([2.0, 0.0, 0.0, 0.0]), Ok([2, 0, 0, 0]));
        assert_eq!(Op::Refund.check([2.0, 7.0, 0.0, 0.0]), Ok([2, 7, 0, 0]));
        assert!(Op::Refund.check([2.0, -1.0, 0.0, 0.0]).is_err());
        assert!(Op::Refund.check([2.0, 0.5, 0.0, 0.0]).is_err());
        let args = Op::SlidingDecrement.check([100.0, 1.0, 9.0, 0.0]).unwrap();
        assert_eq!(args, [100, 1, 9, 0]);
        assert_eq!((taken_in(0), taken_in(9)), (None, Some(9)));
    }
}
