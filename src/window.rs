//! The fixed-window rules every store keeps. The memory table applies them to
//! its slots; [`SCRIPT`] (`window.lua`) is their twin, run by Redis.
//!
//! Time is in microseconds on the store's monotonic clock, so that "under 1 ms
//! left" and "round resetMs up" are exact.

use crate::errors::{Error, Result};

/// The largest count a JavaScript number holds exactly: `Number.MAX_SAFE_INTEGER`.
pub const MAX_SAFE: i64 = (1 << 53) - 1;
/// Windows longer than this are long-lived (token budgets): memoryStore never
/// evicts them to make room.
pub const SHORT_WINDOW_MS: u64 = 60 * 60 * 1000;

const US_PER_MS: u64 = 1000;

/// These rules as a Lua script for Redis, which keeps time through PTTL.
/// `tests/window_twin.rs` runs the same cases through both.
pub const SCRIPT: &str = include_str!("window.lua");

/// One open window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    pub count: i64,
    /// When the window ends, in µs on the store's clock.
    pub ends_at: u64,
    /// Opened with a window longer than [`SHORT_WINDOW_MS`].
    pub long: bool,
}

impl Counter {
    /// Whole ms left, rounded up; `None` once under 1 ms is left.
    pub fn reset_ms(&self, now: u64) -> Option<u64> {
        let left = self.ends_at.checked_sub(now)?;
        (left >= US_PER_MS).then(|| left.div_ceil(US_PER_MS))
    }
}

/// What the caller must do with its stored counter after a hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Leave it as it is (a read, or a read of nothing).
    Keep,
    /// Store this counter (a new window or an update).
    Put(Counter),
    /// Its window has ended and this read opened none: it may be dropped.
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub count: i64,
    pub reset_ms: u64,
    pub change: Change,
}

/// Whether `n` is a whole number from 1 to [`MAX_SAFE`].
/// A cast and back tests for a whole number without a libm call (NaN casts to
/// 0, ±inf saturates).
pub fn is_positive_safe_integer(n: f64) -> bool {
    let whole = n as u64;
    (1..=MAX_SAFE as u64).contains(&whole) && whole as f64 == n
}

/// Checks the numbers of a hit. The JS face checks them first, with messages
/// naming the argument; this keeps the core safe on its own.
pub fn check(window_ms: f64, amount: f64) -> Result<(u64, i64)> {
    if !is_positive_safe_integer(window_ms) {
        return Err(Error::InvalidRange(
            "windowMs must be a positive safe integer",
        ));
    }
    let count = amount as i64;
    if !(-MAX_SAFE..=MAX_SAFE).contains(&count) || count as f64 != amount {
        return Err(Error::InvalidRange("amount must be a safe integer"));
    }
    Ok((window_ms as u64, count))
}

/// Applies one hit to the counter stored for a key (if any) at time `now`.
/// On error nothing may change.
pub fn hit(stored: Option<Counter>, now: u64, window_ms: u64, amount: i64) -> Result<Outcome> {
    let open = stored.and_then(|c| c.reset_ms(now).map(|reset_ms| (c, reset_ms)));
    if let Some((counter, reset_ms)) = open {
        let count = counter.count + amount;
        if count.abs() > MAX_SAFE {
            return Err(Error::CountOutOfRange);
        }
        let change = if amount == 0 {
            Change::Keep
        } else {
            Change::Put(Counter { count, ..counter })
        };
        return Ok(Outcome {
            count,
            reset_ms,
            change,
        });
    }
    if amount == 0 {
        let change = if stored.is_some() {
            Change::Drop
        } else {
            Change::Keep
        };
        return Ok(Outcome {
            count: 0,
            reset_ms: window_ms,
            change,
        });
    }
    let ends_at = now.saturating_add(window_ms.saturating_mul(US_PER_MS));
    Ok(Outcome {
        count: amount,
        reset_ms: window_ms,
        change: Change::Put(Counter {
            count: amount,
            ends_at,
            long: window_ms > SHORT_WINDOW_MS,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    fn put(outcome: Outcome) -> Counter {
        match outcome.change {
            Change::Put(c) => c,
            other => panic!("expected a Put, got {other:?}"),
        }
    }

    #[test]
    fn a_new_window_starts_at_amount() {
        let o = hit(None, 5 * MS, 60_000, 3).unwrap();
        assert_eq!((o.count, o.reset_ms), (3, 60_000));
        assert_eq!(put(o).ends_at, 60_005 * MS);
    }

    #[test]
    fn an_open_window_adds_and_keeps_its_end() {
        let c = put(hit(None, 0, 1_000, 1).unwrap());
        let o = hit(Some(c), 400 * MS, 60_000, 5).unwrap();
        assert_eq!((o.count, o.reset_ms), (6, 600));
        assert_eq!(put(o).ends_at, 1_000 * MS);
    }

    #[test]
    fn reset_ms_rounds_up() {
        let c = put(hit(None, 0, 1_000, 1).unwrap());
        assert_eq!(hit(Some(c), 1, 1_000, 0).unwrap().reset_ms, 1_000);
        assert_eq!(hit(Some(c), 998_999, 1_000, 0).unwrap().reset_ms, 2);
        assert_eq!(hit(Some(c), 999_000, 1_000, 0).unwrap().reset_ms, 1);
    }

    #[test]
    fn under_one_ms_left_is_ended() {
        let c = put(hit(None, 0, 1_000, 7).unwrap());
        let o = hit(Some(c), 999_001, 1_000, 2).unwrap();
        assert_eq!((o.count, o.reset_ms), (2, 1_000));
        assert_eq!(put(o).ends_at, 999_001 + 1_000 * MS);
    }

    #[test]
    fn a_read_opens_no_window() {
        let o = hit(None, 0, 60_000, 0).unwrap();
        assert_eq!((o.count, o.reset_ms, o.change), (0, 60_000, Change::Keep));
        let c = put(hit(None, 0, 10, 4).unwrap());
        let o = hit(Some(c), 20 * MS, 60_000, 0).unwrap();
        assert_eq!((o.count, o.reset_ms, o.change), (0, 60_000, Change::Drop));
        let o = hit(Some(c), 2 * MS, 60_000, 0).unwrap();
        assert_eq!((o.count, o.reset_ms, o.change), (4, 8, Change::Keep));
    }

    #[test]
    fn refunds_go_below_zero() {
        let c = put(hit(None, 0, 60_000, 1).unwrap());
        assert_eq!(hit(Some(c), 0, 60_000, -3).unwrap().count, -2);
        assert_eq!(hit(None, 0, 60_000, -3).unwrap().count, -3);
    }

    #[test]
    fn the_count_stays_safe() {
        let c = put(hit(None, 0, 60_000, MAX_SAFE).unwrap());
        assert_eq!(hit(Some(c), 0, 60_000, 1), Err(Error::CountOutOfRange));
        let c = put(hit(None, 0, 60_000, -MAX_SAFE).unwrap());
        assert_eq!(hit(Some(c), 0, 60_000, -1), Err(Error::CountOutOfRange));
        assert_eq!(hit(Some(c), 0, 60_000, MAX_SAFE).unwrap().count, 0);
    }

    #[test]
    fn long_windows_are_marked() {
        assert!(!put(hit(None, 0, SHORT_WINDOW_MS, 1).unwrap()).long);
        assert!(put(hit(None, 0, SHORT_WINDOW_MS + 1, 1).unwrap()).long);
    }

    #[test]
    fn the_longest_window_does_not_overflow() {
        let o = hit(None, u64::MAX - 5, MAX_SAFE as u64, 1).unwrap();
        assert_eq!(o.reset_ms, MAX_SAFE as u64);
        assert_eq!(put(o).ends_at, u64::MAX);
    }

    #[test]
    fn check_rejects_what_js_would() {
        assert!(check(0.0, 1.0).is_err());
        assert!(check(1.5, 1.0).is_err());
        assert!(check(f64::NAN, 1.0).is_err());
        assert!(check(f64::INFINITY, 1.0).is_err());
        assert!(check(-1.0, 1.0).is_err());
        assert!(check(1.0, f64::NAN).is_err());
        assert!(check(1.0, f64::NEG_INFINITY).is_err());
        assert!(check(1.0, 2f64.powi(53)).is_err());
        assert!(check(1.0, 0.5).is_err());
        assert_eq!(check(1.0, -(MAX_SAFE as f64)), Ok((1, -MAX_SAFE)));
        assert_eq!(check(MAX_SAFE as f64, -0.0), Ok((MAX_SAFE as u64, 0)));
    }
}
