//! The fixed-window rules every store keeps. The memory table applies them to
//! its slots; `redis::scripts::WINDOW` (`window.lua`) is their twin, run by Redis.
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
    /// The window's id, which a consume answers and a refund names: its end
    /// (as a safe integer, so JavaScript holds it exactly; windows ending past
    /// 2^53 µs on the clock, over 100 years on, share one).
    pub fn window(&self) -> u64 {
        self.ends_at.min(MAX_SAFE as u64)
    }

    /// Whole ms left, counted in ms ticks as Redis's PTTL does (its end's
    /// tick less now's); `None` once that is under 1 ms. So a window of `w` ms
    /// opened in tick `t` is open in ticks `t` to `t + w - 1`, as a key Redis
    /// gave `PEXPIRE w` in tick `t` is.
    #[inline(always)]
    pub fn reset_ms(&self, now: u64) -> Option<u64> {
        let left = (self.ends_at / US_PER_MS).checked_sub(now / US_PER_MS)?;
        (left > 0).then_some(left)
    }
}

/// What the caller must do with its stored state after an operation; `S` is
/// the algorithm's state (a fixed-window [`Counter`] unless said otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change<S = Counter> {
    /// Leave it as it is (a read, or a read of nothing).
    Keep,
    /// Store this state (a new window or an update).
    Put(S),
    /// Its window has ended and this read opened none: it may be dropped.
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub count: i64,
    pub reset_ms: u64,
    pub change: Change,
}

/// `n` as a whole number from `lo` to `hi` (both within ±[`MAX_SAFE`]), if it
/// is one. Compared as doubles first (NaN fails both), so that the cast back
/// and forth that tests for a whole number needs no saturation and no libm call.
#[inline(always)]
fn safe_integer_in(n: f64, lo: i64, hi: i64) -> Option<i64> {
    debug_assert!(
        -MAX_SAFE <= lo && hi <= MAX_SAFE,
        "bounds a double holds exactly"
    );
    if !(n >= lo as f64 && n <= hi as f64) {
        return None;
    }
    let whole = n as i64;
    (whole as f64 == n).then_some(whole)
}

/// Whether `n` is a whole number from 1 to [`MAX_SAFE`].
pub fn is_positive_safe_integer(n: f64) -> bool {
    safe_integer_in(n, 1, MAX_SAFE).is_some()
}

/// Checks the numbers of a hit. The JS face checks them first, with messages
/// naming the argument; this keeps the core safe on its own.
#[inline]
pub fn check(window_ms: f64, amount: f64) -> Result<(u64, i64)> {
    let Some(window_ms) = safe_integer_in(window_ms, 1, MAX_SAFE) else {
        return Err(Error::InvalidRange(
            "windowMs must be a positive safe integer",
        ));
    };
    let Some(count) = safe_integer_in(amount, -MAX_SAFE, MAX_SAFE) else {
        return Err(Error::InvalidRange("amount must be a safe integer"));
    };
    Ok((window_ms as u64, count))
}

/// A hit on an open window, `reset_ms` from its end: `amount` added to its count.
#[inline(always)]
pub fn add(counter: Counter, reset_ms: u64, amount: i64) -> Result<Outcome> {
    let count = counter.count + amount;
    if count.abs() > MAX_SAFE {
        return Err(Error::CountOutOfRange);
    }
    let change = if amount == 0 {
        Change::Keep
    } else {
        Change::Put(Counter { count, ..counter })
    };
    Ok(Outcome {
        count,
        reset_ms,
        change,
    })
}

/// Applies one hit to the counter stored for a key (if any) at time `now`.
/// On error nothing may change.
pub fn hit(stored: Option<Counter>, now: u64, window_ms: u64, amount: i64) -> Result<Outcome> {
    let open = stored.and_then(|c| c.reset_ms(now).map(|reset_ms| (c, reset_ms)));
    if let Some((counter, reset_ms)) = open {
        return add(counter, reset_ms, amount);
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

// Limit-aware consume and refund, on the same counter (and Redis data layout)
// as `hit`, so all three agree on one key.

// Their Lua twins are `redis::scripts::WINDOW_CONSUME` and `WINDOW_REFUND`.

/// The longest window of the sliding window, and the longest time a token
/// bucket takes to fill: 2^52 µs (about 142 years), so that every time the
/// Lua twins compute is an exact double.
pub const MAX_PERIOD_MS: u64 = (1 << 52) / US_PER_MS;

/// `n` as a count from 0 to [`MAX_SAFE`], if it is one.
pub fn non_negative_safe_integer(n: f64) -> Option<i64> {
    safe_integer_in(n, 0, MAX_SAFE)
}

/// Checks the numbers of a consume: `(window_ms, limit, cost)`.
pub fn check_consume(window_ms: f64, limit: f64, cost: f64) -> Result<(u64, i64, i64)> {
    let (window_ms, _) = check(window_ms, 0.0)?;
    let limit = non_negative_safe_integer(limit).ok_or(Error::InvalidRange(
        "limit must be a safe integer of 0 or more",
    ))?;
    let cost = non_negative_safe_integer(cost).ok_or(Error::InvalidRange(
        "cost must be a safe integer of 0 or more",
    ))?;
    Ok((window_ms, limit, cost))
}

/// Checks the amount of a refund.
pub fn check_refund(amount: f64) -> Result<i64> {
    non_negative_safe_integer(amount).ok_or(Error::InvalidRange(
        "amount must be a safe integer of 0 or more",
    ))
}

/// What remains of `limit` at `count`: from 0 to `limit` (a count below 0,
/// left by refunds through `hit`, still answers at most `limit`).
pub fn remaining(limit: i64, count: i64) -> i64 {
    limit.saturating_sub(count).clamp(0, limit)
}

/// The answer of a limit-aware consume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Consumed {
    /// Whether `count + cost <= limit` held, so that `cost` was added.
    pub allowed: bool,
    /// The count after this consume (unchanged when refused); 0 with no open window.
    pub count: i64,
    /// `limit - count`, from 0 to `limit`.
    pub remaining: i64,
    /// Whole ms until the window ends (and frees); `window_ms` with no open window.
    pub reset_ms: u64,
    /// The id of the window counted in ([`Counter::window`]); 0 when none is open.
    pub window: u64,
    pub change: Change,
}

/// Adds `cost` only if the count stays within `limit`. A refused consume, and
/// a consume of cost 0 (a read), change nothing and open no window.
pub fn consume(
    stored: Option<Counter>,
    now: u64,
    window_ms: u64,
    limit: i64,
    cost: i64,
) -> Consumed {
    let open = stored.and_then(|c| c.reset_ms(now).map(|reset_ms| (c, reset_ms)));
    let (count, reset_ms) = open.map_or((0, window_ms), |(c, ms)| (c.count, ms));
    // Both are within ±MAX_SAFE, so the sum fits, and an allowed sum is safe.
    let allowed = count + cost <= limit;
    let (count, change) = match open {
        _ if !allowed || cost == 0 => {
            let change = match (open, stored) {
                (None, Some(_)) => Change::Drop,
                _ => Change::Keep,
            };
            (count, change)
        }
        Some((counter, _)) => {
            let count = count + cost;
            (count, Change::Put(Counter { count, ..counter }))
        }
        None => (
            cost,
            Change::Put(Counter {
                count: cost,
                ends_at: now.saturating_add(window_ms.saturating_mul(US_PER_MS)),
                long: window_ms > SHORT_WINDOW_MS,
            }),
        ),
    };
    let window = match (&change, open) {
        (Change::Put(c), _) => c.window(),
        (_, Some((c, _))) => c.window(),
        _ => 0,
    };
    Consumed {
        allowed,
        count,
        remaining: remaining(limit, count),
        reset_ms,
        window,
        change,
    }
}

/// The answer of a refund.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refunded {
    /// The count after the refund; 0 when no window was open.
    pub count: i64,
    /// Whole ms until the open window ends; 0 when none was open.
    pub reset_ms: u64,
    pub change: Change,
}

/// Gives back up to `amount` within the open window, never taking the count
/// below 0. With no open window it does nothing (and opens none).
pub fn refund(stored: Option<Counter>, now: u64, amount: i64) -> Refunded {
    refund_to(stored, now, amount, None)
}

/// [`refund`], given the window the take counted in (`taken_in`, the id its
/// consume answered): while another window is open it does nothing, as with
/// none open, so that a late refund never takes from a window another
/// request opened.
pub fn refund_to(
    stored: Option<Counter>,
    now: u64,
    amount: i64,
    taken_in: Option<u64>,
) -> Refunded {
    let open = stored.and_then(|c| c.reset_ms(now).map(|reset_ms| (c, reset_ms)));
    if let (Some((c, _)), Some(w)) = (open, taken_in) {
        if c.window() != w {
            return Refunded {
                count: 0,
                reset_ms: 0,
                change: Change::Keep,
            };
        }
    }
    let Some((counter, reset_ms)) = open else {
        return Refunded {
            count: 0,
            reset_ms: 0,
            change: if stored.is_some() {
                Change::Drop
            } else {
                Change::Keep
            },
        };
    };
    let taken = amount.min(counter.count.max(0));
    let count = counter.count - taken;
    Refunded {
        count,
        reset_ms,
        change: if taken == 0 {
            Change::Keep
        } else {
            Change::Put(Counter { count, ..counter })
        },
    }
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
    fn a_window_lasts_its_ms_ticks_as_pexpire_does() {
        // Opened 500 µs into tick 1 with 1 ms: open through tick 1, ended in tick 2.
        let c = put(hit(None, 1_500, 1, 1).unwrap());
        let o = hit(Some(c), 1_999, 1, 1).unwrap();
        assert_eq!((o.count, o.reset_ms), (2, 1));
        assert_eq!(hit(Some(c), 2_000, 1, 1).unwrap().count, 1);
        // A limit-1 consume twice in one tick: the second is refused.
        let first = consume(None, 1_500, 1, 1, 1);
        let second = consume(Some(put_of(first.change)), 1_900, 1, 1, 1);
        assert!(first.allowed && !second.allowed);
        assert!(consume(Some(put_of(first.change)), 2_000, 1, 1, 1).allowed);
        // A refund finds the window through the tick, and none after it.
        assert_eq!(refund(Some(put_of(first.change)), 1_999, 1).count, 0);
        assert_eq!(refund(Some(put_of(first.change)), 2_000, 1).reset_ms, 0);
        // resetMs is the end's tick less now's, as PTTL is.
        let c = put(hit(None, 10_700, 5, 1).unwrap());
        assert_eq!(hit(Some(c), 10_999, 5, 0).unwrap().reset_ms, 5);
        assert_eq!(hit(Some(c), 11_000, 5, 0).unwrap().reset_ms, 4);
        assert_eq!(hit(Some(c), 14_999, 5, 0).unwrap().reset_ms, 1);
        assert_eq!(hit(Some(c), 15_000, 5, 0).unwrap().count, 0);
    }

    #[test]
    fn under_one_ms_left_is_ended() {
        // Opened 500 µs into tick 0: under 1 ms is left in tick 1000.
        let c = put(hit(None, 500, 1_000, 7).unwrap());
        assert_eq!(hit(Some(c), 999_999, 1_000, 0).unwrap().count, 7);
        let o = hit(Some(c), 1_000_000, 1_000, 2).unwrap();
        assert_eq!((o.count, o.reset_ms), (2, 1_000));
        assert_eq!(put(o).ends_at, 1_000_000 + 1_000 * MS);
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
        assert!(check(2f64.powi(53), 1.0).is_err());
        assert!(check(1.0, -(2f64.powi(53))).is_err());
        assert!(check(f64::MIN_POSITIVE, 1.0).is_err());
        assert!(check(1.0, 0.5).is_err());
        assert_eq!(check(1.0, -(MAX_SAFE as f64)), Ok((1, -MAX_SAFE)));
        assert_eq!(check(MAX_SAFE as f64, -0.0), Ok((MAX_SAFE as u64, 0)));
    }

    fn open(count: i64, ends_at: u64) -> Counter {
        Counter {
            count,
            ends_at,
            long: false,
        }
    }

    #[test]
    fn consume_opens_a_window_at_cost() {
        let o = consume(None, 5 * MS, 60_000, 10, 3);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.reset_ms),
            (true, 3, 7, 60_000)
        );
        assert_eq!(put_of(o.change).ends_at, 60_005 * MS);
    }

    #[test]
    fn consume_adds_only_within_the_limit() {
        let c = open(8, 10_000 * MS);
        let o = consume(Some(c), 4_000 * MS, 60_000, 10, 2);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.reset_ms),
            (true, 10, 0, 6_000)
        );
        assert_eq!(put_of(o.change), open(10, 10_000 * MS));
        let o = consume(Some(c), 4_000 * MS, 60_000, 10, 3);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.reset_ms),
            (false, 8, 2, 6_000)
        );
        assert_eq!(o.change, Change::Keep);
    }

    #[test]
    fn consume_of_cost_zero_reads() {
        let o = consume(None, 0, 1_000, 0, 0);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.change),
            (true, 0, 0, Change::Keep)
        );
        let o = consume(Some(open(5, 2 * MS)), 0, 1_000, 5, 0);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.change),
            (true, 5, 0, Change::Keep)
        );
        // Over the limit (hit took it there, or a lower limit is asked now).
        let o = consume(Some(open(6, 2 * MS)), 0, 1_000, 5, 0);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.change),
            (false, 6, 0, Change::Keep)
        );
    }

    #[test]
    fn consume_above_the_limit_changes_nothing() {
        let o = consume(None, 0, 1_000, 4, 5);
        assert_eq!(
            (o.allowed, o.count, o.reset_ms, o.change),
            (false, 0, 1_000, Change::Keep)
        );
        let o = consume(Some(open(1, 5 * MS)), 6 * MS, 1_000, 4, 5);
        assert_eq!((o.allowed, o.count, o.change), (false, 0, Change::Drop));
        let o = consume(Some(open(0, 5 * MS)), 0, 1_000, MAX_SAFE, MAX_SAFE);
        assert!(o.allowed);
        let o = consume(Some(open(1, 5 * MS)), 0, 1_000, MAX_SAFE, MAX_SAFE);
        assert_eq!((o.allowed, o.count), (false, 1));
    }

    #[test]
    fn consume_at_the_window_edge_starts_anew() {
        let c = open(9, 1_000 * MS);
        let o = consume(Some(c), 1_000_000, 500, 10, 2);
        assert_eq!((o.allowed, o.count, o.reset_ms), (true, 2, 500));
        let o = consume(Some(c), 999_999, 500, 10, 2);
        assert_eq!((o.allowed, o.count, o.reset_ms), (false, 9, 1));
    }

    #[test]
    fn consume_below_zero_answers_at_most_the_limit_remaining() {
        let o = consume(Some(open(-4, 5 * MS)), 0, 1_000, 3, 1);
        assert_eq!((o.allowed, o.count, o.remaining), (true, -3, 3));
        let o = consume(Some(open(-MAX_SAFE, 5 * MS)), 0, 1_000, MAX_SAFE, MAX_SAFE);
        assert_eq!((o.allowed, o.count, o.remaining), (true, 0, MAX_SAFE));
    }

    #[test]
    fn refund_gives_back_within_the_window_down_to_zero() {
        let c = open(5, 10 * MS);
        let o = refund(Some(c), 2 * MS, 2);
        assert_eq!(
            (o.count, o.reset_ms, put_of(o.change)),
            (3, 8, open(3, 10 * MS))
        );
        let o = refund(Some(c), 2 * MS, 9);
        assert_eq!((o.count, o.reset_ms), (0, 8));
        let o = refund(Some(c), 2 * MS, 0);
        assert_eq!((o.count, o.change), (5, Change::Keep));
        let o = refund(Some(open(-2, 10 * MS)), 0, 1);
        assert_eq!((o.count, o.change), (-2, Change::Keep));
    }

    #[test]
    fn refund_opens_no_window() {
        assert_eq!(
            refund(None, 0, 3),
            Refunded {
                count: 0,
                reset_ms: 0,
                change: Change::Keep
            }
        );
        let o = refund(Some(open(5, 10 * MS)), 10_000, 3);
        assert_eq!((o.count, o.reset_ms, o.change), (0, 0, Change::Drop));
    }

    #[test]
    fn a_refund_naming_its_window_gives_back_to_that_window_alone() {
        let taken = consume(None, 5 * MS, 1_000, 10, 3);
        let c = match taken.change {
            Change::Put(c) => c,
            other => panic!("expected a Put, got {other:?}"),
        };
        assert_eq!(taken.window, 1_005 * MS);
        assert_eq!(consume(Some(c), 6 * MS, 1_000, 10, 1).window, taken.window);
        let o = refund_to(Some(c), 500 * MS, 2, Some(taken.window));
        assert_eq!((o.count, o.reset_ms), (1, 505));
        // The window it named ended and another request opened the next: nothing.
        let next = consume(Some(c), 1_005 * MS, 1_000, 10, 1);
        let n = match next.change {
            Change::Put(n) => n,
            other => panic!("expected a Put, got {other:?}"),
        };
        assert_ne!(next.window, taken.window);
        let o = refund_to(Some(n), 1_006 * MS, 1, Some(taken.window));
        assert_eq!((o.count, o.reset_ms, o.change), (0, 0, Change::Keep));
        // Without a window: today's refund, from whatever window is open.
        assert_eq!(refund_to(Some(n), 1_006 * MS, 1, None).count, 0);
        // A refused consume with no open window answers none.
        assert_eq!(consume(None, 0, 1_000, 1, 2).window, 0);
    }

    #[test]
    fn checks_of_consume_and_refund() {
        assert_eq!(check_consume(1_000.0, 0.0, 0.0), Ok((1_000, 0, 0)));
        assert!(check_consume(0.0, 1.0, 1.0).is_err());
        assert!(check_consume(1.0, -1.0, 1.0).is_err());
        assert!(check_consume(1.0, 1.0, -1.0).is_err());
        assert!(check_consume(1.0, 1.5, 1.0).is_err());
        assert!(check_consume(1.0, 1.0, f64::NAN).is_err());
        assert!(check_consume(1.0, 2f64.powi(53), 1.0).is_err());
        assert_eq!(check_refund(-0.0), Ok(0));
        assert!(check_refund(-1.0).is_err());
        assert!(check_refund(f64::INFINITY).is_err());
    }

    fn put_of(change: Change) -> Counter {
        match change {
            Change::Put(c) => c,
            other => panic!("expected a Put, got {other:?}"),
        }
    }

    /// The fixed-window rules as plainly as they are written in the README:
    /// one `(count, end)` per key, in µs.
    #[derive(Default)]
    struct WindowModel(std::collections::HashMap<u8, (i64, u64)>);

    impl WindowModel {
        fn open(&self, key: u8, now: u64) -> Option<(i64, u64)> {
            self.0
                .get(&key)
                .copied()
                .filter(|&(_, end)| end / MS > now / MS)
        }
        fn consume(
            &mut self,
            key: u8,
            now: u64,
            window_ms: u64,
            limit: i64,
            cost: i64,
        ) -> (bool, i64, u64) {
            let (count, end) = self.open(key, now).unwrap_or((0, now + window_ms * MS));
            if count + cost > limit {
                return (false, count, end / MS - now / MS);
            }
            if cost > 0 {
                self.0.insert(key, (count + cost, end));
            }
            (true, count + cost, end / MS - now / MS)
        }
        fn refund(&mut self, key: u8, now: u64, amount: i64) -> (i64, u64) {
            match self.open(key, now) {
                None => (0, 0),
                Some((count, end)) => {
                    let count = if count > 0 {
                        (count - amount).max(0)
                    } else {
                        count
                    };
                    self.0.insert(key, (count, end));
                    (count, end / MS - now / MS)
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn consume_and_refund_agree_with_the_model(
            ops in proptest::collection::vec(
                (0u8..4, 0u64..1_500_000, 1u64..2_000, 0i64..8, 0i64..4, proptest::bool::ANY),
                1..200,
            )
        ) {
            let mut stored: std::collections::HashMap<u8, Counter> = Default::default();
            let mut model = WindowModel::default();
            let mut now = 0;
            for (key, step, window_ms, limit, amount, is_refund) in ops {
                now += step;
                let held = stored.get(&key).copied();
                let change = if is_refund {
                    let o = refund(held, now, amount);
                    proptest::prop_assert_eq!((o.count, o.reset_ms), model.refund(key, now, amount));
                    o.change
                } else {
                    let o = consume(held, now, window_ms, limit, amount);
                    proptest::prop_assert_eq!(
                        (o.allowed, o.count, o.reset_ms),
                        model.consume(key, now, window_ms, limit, amount)
                    );
                    proptest::prop_assert_eq!(o.remaining, (limit - o.count).clamp(0, limit));
                    o.change
                };
                match change {
                    Change::Keep => {}
                    Change::Put(c) => {
                        stored.insert(key, c);
                    }
                    Change::Drop => {
                        stored.remove(&key);
                    }
                }
            }
        }
    }
}
