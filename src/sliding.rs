//! The sliding window of seed 004: windows aligned on the clock, and the
//! estimate of the window that ends now is the current window's count plus
//! the previous window's, weighted by the share of it still inside.
//! `redis::scripts::SLIDING` (`sliding.lua`) is the twin, run by Redis on the server's TIME.
//!
//! Time is in µs on the caller's clock: the memory store's, or Redis's TIME.
//! The weighting is `ceil(previous * left / window)`, rounded up as seed 004
//! rounds ("so we never under-count"), so that a consume passes only if the
//! exact `previous * left / window + current + cost <= limit` holds. It is
//! computed exactly in integers (here in u128; `sliding.lua` in doubles, by a
//! long multiplication whose every step is an integer below 2^54), so both
//! twins answer alike for every input in range.

use crate::errors::{Error, Result};
use crate::window::{self, Change, MAX_PERIOD_MS, MAX_SAFE};

const US_PER_MS: u64 = 1000;

/// The state kept for a key: the counts of one window and the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sliding {
    /// Where the current window starts, in µs (a multiple of the window).
    pub start: u64,
    pub current: i64,
    pub previous: i64,
    /// When the state stops counting (the end of the window after the one it
    /// counts in), so that it may be dropped: Redis's PTTL.
    pub ends_at: u64,
}

/// The answer of an increment or a decrement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The window this call counted in (its end, in µs): what a decrement
    /// names to give back to it alone.
    pub window: u64,
    /// The estimate after this call: weighted previous plus current.
    pub count: i64,
    /// Whole ms until the current window ends, from 1 to the window.
    pub reset_ms: u64,
    pub change: Change<Sliding>,
}

/// The answer of a limit-aware consume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingConsumed {
    /// Whether `estimate + cost <= limit` held, so that `cost` was added.
    pub allowed: bool,
    /// The estimate after this consume (unchanged when refused).
    pub count: i64,
    /// `limit - count`, from 0 to `limit`.
    pub remaining: i64,
    /// Whole ms until the current window ends.
    pub reset_ms: u64,
    /// 0 when allowed; else whole ms until the same consume would be allowed
    /// with no other traffic. A cost above the limit never is: then the ms
    /// until the key is as new, at least `reset_ms`.
    pub retry_ms: u64,
    /// The window the cost was added to (its end, in µs).
    pub window: u64,
    pub change: Change<Sliding>,
}

/// Checks a window and an amount (or cost): `(window_ms, amount)`.
pub fn check(window_ms: f64, amount: f64) -> Result<(u64, i64)> {
    let (window_ms, _) = window::check(window_ms, 0.0)?;
    if window_ms > MAX_PERIOD_MS {
        return Err(Error::InvalidRange(
            "windowMs of a sliding window must be at most 4503599627370 (about 142 years)",
        ));
    }
    let amount = window::non_negative_safe_integer(amount).ok_or(Error::InvalidRange(
        "cost must be a safe integer of 0 or more",
    ))?;
    Ok((window_ms, amount))
}

/// Checks the numbers of a consume: `(window_ms, limit, cost)`.
pub fn check_consume(window_ms: f64, limit: f64, cost: f64) -> Result<(u64, i64, i64)> {
    let (window_ms, cost) = check(window_ms, cost)?;
    let limit = window::non_negative_safe_integer(limit).ok_or(Error::InvalidRange(
        "limit must be a safe integer of 0 or more",
    ))?;
    Ok((window_ms, limit, cost))
}

/// The previous window's `count` weighted by `left` µs of `window` µs,
/// rounded up: `ceil(count * left / window)`, exactly.
pub fn weighted(count: i64, left: u64, window: u64) -> i64 {
    if left >= window {
        return count;
    }
    (count as u128 * left as u128).div_ceil(window as u128) as i64
}

/// The largest `left` in `0..=most` at which `count`, weighted, is at most
/// `room`: `count * left <= room * window`, so `floor(room * window / count)`.
fn latest(count: i64, room: i64, most: u64, window: u64) -> u64 {
    if room >= count {
        return most;
    }
    let left = room as u128 * window as u128 / count as u128;
    most.min(left as u64)
}

/// The state as seen at `now`.
struct View {
    start: u64,
    /// µs until the current window ends: from 1 to the window.
    left: u64,
    window: u64,
    previous: i64,
    current: i64,
}

impl View {
    fn at(stored: Option<Sliding>, now: u64, window_ms: u64) -> View {
        let window = window_ms * US_PER_MS;
        let start = now - now % window;
        let (start, previous, current) = match stored {
            // A start ahead of the clock (a server clock set back) still counts in full.
            Some(s) if s.start >= start => (s.start, s.previous, s.current),
            Some(s) if s.start + window == start => (start, s.current, 0),
            _ => (start, 0, 0),
        };
        View {
            start,
            left: window - now % window,
            window,
            previous,
            current,
        }
    }

    /// The current window's end: its id.
    fn end(&self) -> u64 {
        self.start + self.window
    }

    fn estimate(&self) -> i64 {
        weighted(self.previous, self.left, self.window) + self.current
    }

    fn reset_ms(&self) -> u64 {
        self.left.div_ceil(US_PER_MS)
    }

    /// The state to keep, or `Drop` once it counts nothing.
    fn change(&self) -> Change<Sliding> {
        let windows = match (self.current, self.previous) {
            (0, 0) => return Change::Drop,
            (0, _) => 1,
            _ => 2,
        };
        Change::Put(Sliding {
            start: self.start,
            current: self.current,
            previous: self.previous,
            ends_at: self.start + windows * self.window,
        })
    }

    /// A read changes nothing, but lets go of a state that has ended. One
    /// that only counts nothing under this `windowMs` is kept: written under
    /// another, it may still count under that one (as on Redis, where a read
    /// never deletes).
    fn unchanged(&self, stored: Option<Sliding>, now: u64) -> Change<Sliding> {
        match stored {
            Some(s) if s.ends_at <= now => Change::Drop,
            _ => Change::Keep,
        }
    }
}

/// Adds `amount` to the current window with no limit (seed 004's `increment`);
/// `amount` 0 reads. On error nothing may change.
pub fn increment(stored: Option<Sliding>, now: u64, window_ms: u64, amount: i64) -> Result<Hit> {
    let mut view = View::at(stored, now, window_ms);
    let count = view.estimate() + amount;
    if count > MAX_SAFE {
        return Err(Error::CountOutOfRange);
    }
    let change = if amount == 0 {
        view.unchanged(stored, now)
    } else {
        view.current += amount;
        view.change()
    };
    Ok(Hit {
        window: view.end(),
        count,
        reset_ms: view.reset_ms(),
        change,
    })
}

/// Takes back up to `amount`, never below 0, and never creates a state.
/// Given the window its take answered (`taken_in`), only from that window:
/// the current one, or the previous one once the clock has moved a window on
/// (a late decrement still finds the take it undoes); from any other window
/// nothing, so that it never returns a count to a window it did not come
/// from. Without one: from the current window first, then the previous one.
pub fn decrement(
    stored: Option<Sliding>,
    now: u64,
    window_ms: u64,
    amount: i64,
    taken_in: Option<u64>,
) -> Hit {
    let mut view = View::at(stored, now, window_ms);
    let (from_current, from_previous) = match taken_in {
        None => {
            let from_current = amount.min(view.current);
            (from_current, (amount - from_current).min(view.previous))
        }
        Some(w) if w == view.end() => (amount.min(view.current), 0),
        Some(w) if w == view.start => (0, amount.min(view.previous)),
        Some(_) => (0, 0),
    };
    let change = if from_current + from_previous == 0 {
        view.unchanged(stored, now)
    } else {
        view.current -= from_current;
        view.previous -= from_previous;
        view.change()
    };
    Hit {
        window: view.end(),
        count: view.estimate(),
        reset_ms: view.reset_ms(),
        change,
    }
}

/// Adds `cost` only if the estimate stays within `limit`. A refused consume,
/// and one of cost 0 (a read), change nothing.
pub fn consume(
    stored: Option<Sliding>,
    now: u64,
    window_ms: u64,
    limit: i64,
    cost: i64,
) -> SlidingConsumed {
    let mut view = View::at(stored, now, window_ms);
    let estimate = view.estimate();
    let reset_ms = view.reset_ms();
    if estimate + cost <= limit {
        let change = if cost == 0 {
            view.unchanged(stored, now)
        } else {
            view.current += cost;
            view.change()
        };
        let count = estimate + cost;
        return SlidingConsumed {
            allowed: true,
            count,
            remaining: window::remaining(limit, count),
            reset_ms,
            retry_ms: 0,
            window: view.end(),
            change,
        };
    }
    let wait = if cost > limit {
        None
    } else if view.current + cost <= limit {
        // The previous window's share has to fall, within this window.
        let left = latest(
            view.previous,
            limit - cost - view.current,
            view.left - 1,
            view.window,
        );
        Some(view.left - left)
    } else {
        // This window's count has to become the previous one, and fall.
        let left = latest(view.current, limit - cost, view.window, view.window);
        Some(view.left + view.window - left)
    };
    let retry_ms = match wait {
        Some(us) => us.div_ceil(US_PER_MS),
        None if view.current > 0 => (view.left + view.window).div_ceil(US_PER_MS),
        None => reset_ms,
    };
    SlidingConsumed {
        allowed: false,
        count: estimate,
        remaining: window::remaining(limit, estimate),
        reset_ms,
        retry_ms,
        window: view.end(),
        change: view.unchanged(stored, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const MS: u64 = 1000;
    const W: u64 = 10_000;

    fn put(change: Change<Sliding>) -> Sliding {
        match change {
            Change::Put(s) => s,
            other => panic!("expected a Put, got {other:?}"),
        }
    }

    /// A state for the window starting at `start_ms` (a multiple of W).
    fn state(start_ms: u64, previous: i64, current: i64) -> Option<Sliding> {
        Some(Sliding {
            start: start_ms * MS,
            previous,
            current,
            ends_at: (start_ms + 2 * W) * MS,
        })
    }

    #[test]
    fn a_new_key_counts_in_the_aligned_window() {
        let o = increment(None, 25_000 * MS, W, 1).unwrap();
        assert_eq!((o.count, o.reset_ms), (1, 5_000));
        assert_eq!(put(o.change), state(20_000, 0, 1).unwrap());
    }

    #[test]
    fn the_previous_window_weighs_by_its_share_inside() {
        // 25% into the window: 75% of the previous window's 8 hits, plus 2.
        let o = increment(state(10_000, 0, 8), 22_500 * MS, W, 0).unwrap();
        assert_eq!((o.count, o.reset_ms, o.change), (6, 7_500, Change::Keep));
        let o = increment(state(10_000, 0, 8), 22_500 * MS, W, 2).unwrap();
        assert_eq!(o.count, 6 + 2);
        assert_eq!(put(o.change), state(20_000, 8, 2).unwrap());
        // Rounded up, as seed 004 rounds: 8 * 0.7499 = 5.9992 weighs 6.
        assert_eq!(
            increment(state(10_000, 0, 8), 22_501 * MS, W, 0)
                .unwrap()
                .count,
            6
        );
        // A single hit weighs 1 until the window before it has wholly slid out.
        assert_eq!(
            increment(state(10_000, 0, 1), 29_999_999, W, 0)
                .unwrap()
                .count,
            1
        );
        // At the start of a window the previous one counts in full.
        assert_eq!(
            increment(state(10_000, 0, 8), 20_000 * MS, W, 0)
                .unwrap()
                .count,
            8
        );
        assert_eq!(
            increment(state(10_000, 0, 8), 20_000 * MS, W, 0)
                .unwrap()
                .reset_ms,
            W
        );
    }

    #[test]
    fn older_windows_count_nothing() {
        let o = increment(state(10_000, 5, 8), 30_000 * MS, W, 0).unwrap();
        assert_eq!((o.count, o.change), (0, Change::Drop));
        let o = increment(state(10_000, 5, 8), 30_000 * MS, W, 1).unwrap();
        assert_eq!(put(o.change), state(30_000, 0, 1).unwrap());
    }

    #[test]
    fn a_read_under_another_window_keeps_a_state_that_still_counts_under_its_own() {
        // Written under W (10 s), read under 1 s: it counts nothing there, yet
        // still counts under W until its end.
        let o = increment(state(20_000, 0, 3), 25_000 * MS, 1_000, 0).unwrap();
        assert_eq!((o.count, o.change), (0, Change::Keep));
        let o = decrement(state(20_000, 0, 3), 25_000 * MS, 1_000, 1, None);
        assert_eq!((o.count, o.change), (0, Change::Keep));
        let o = consume(state(20_000, 0, 3), 25_000 * MS, 1_000, 5, 0);
        assert_eq!((o.count, o.change), (0, Change::Keep));
        // Once it has ended, a read lets it go.
        let o = increment(state(20_000, 0, 3), 40_000 * MS, 1_000, 0).unwrap();
        assert_eq!((o.count, o.change), (0, Change::Drop));
    }

    #[test]
    fn a_state_ahead_of_the_clock_counts_in_full() {
        let o = increment(state(20_000, 3, 4), 15_000 * MS, W, 1).unwrap();
        assert_eq!((o.count, o.reset_ms), (2 + 5, 5_000));
        assert_eq!(put(o.change), state(20_000, 3, 5).unwrap());
    }

    #[test]
    fn under_a_ms_left_answers_one() {
        let o = increment(None, 29_999_500, W, 1).unwrap();
        assert_eq!(o.reset_ms, 1);
        assert_eq!(put(o.change).ends_at, 40_000 * MS);
    }

    #[test]
    fn the_count_stays_safe() {
        let o = increment(state(0, 0, MAX_SAFE), 0, W, 1);
        assert_eq!(o, Err(Error::CountOutOfRange));
        let o = increment(state(0, 0, MAX_SAFE), 10_000 * MS, W, 1);
        assert_eq!(o, Err(Error::CountOutOfRange));
        assert_eq!(
            increment(state(0, 0, MAX_SAFE - 1), 0, W, 1).unwrap().count,
            MAX_SAFE
        );
        // Half of the window gone: about half of the previous count still weighs.
        let o = increment(state(0, 0, MAX_SAFE), 15_000 * MS, W, 1).unwrap();
        assert_eq!(o.count, (MAX_SAFE + 1) / 2 + 1);
    }

    #[test]
    fn decrement_takes_from_current_then_previous() {
        let o = decrement(state(20_000, 4, 2), 25_000 * MS, W, 3, None);
        assert_eq!(
            put(o.change),
            state(20_000, 3, 0).unwrap().with_ends(30_000)
        );
        // 3 * 0.5 = 1.5 weighs 2.
        assert_eq!(o.count, 2);
        let o = decrement(state(20_000, 4, 2), 25_000 * MS, W, 9, None);
        assert_eq!((o.count, o.change), (0, Change::Drop));
        // A decrement one window on finds the hits in the previous window.
        let o = decrement(state(20_000, 4, 2), 30_000 * MS, W, 1, None);
        assert_eq!(
            put(o.change),
            state(30_000, 1, 0).unwrap().with_ends(40_000)
        );
        let o = decrement(None, 0, W, 1, None);
        assert_eq!((o.count, o.reset_ms, o.change), (0, W, Change::Keep));
        let o = decrement(state(0, 1, 1), 30_000 * MS, W, 1, None);
        assert_eq!((o.count, o.change), (0, Change::Drop));
    }

    #[test]
    fn a_decrement_naming_its_window_gives_back_to_that_window_alone() {
        let taken_in = Some(30_000 * MS);
        // In its own window: from the current count only.
        let o = decrement(state(20_000, 4, 2), 25_000 * MS, W, 3, taken_in);
        assert_eq!(
            put(o.change),
            state(20_000, 4, 0).unwrap().with_ends(30_000)
        );
        // A window on: from the previous count, which was its window's.
        let o = decrement(state(20_000, 4, 2), 30_000 * MS, W, 1, taken_in);
        assert_eq!(
            put(o.change),
            state(30_000, 1, 0).unwrap().with_ends(40_000)
        );
        let o = decrement(state(30_000, 2, 5), 35_000 * MS, W, 1, taken_in);
        assert_eq!(put(o.change), state(30_000, 1, 5).unwrap());
        // Two windows on, or in a window before its own: nothing.
        let o = decrement(state(40_000, 2, 5), 45_000 * MS, W, 1, taken_in);
        assert_eq!((o.count, o.change), (1 + 5, Change::Keep));
        let o = decrement(state(10_000, 2, 5), 15_000 * MS, W, 1, taken_in);
        assert_eq!(o.change, Change::Keep);
        assert_eq!(o.window, 20_000 * MS);
    }

    impl Sliding {
        fn with_ends(self, ends_ms: u64) -> Sliding {
            Sliding {
                ends_at: ends_ms * MS,
                ..self
            }
        }
    }

    #[test]
    fn consume_adds_within_the_limit() {
        let o = consume(state(10_000, 0, 8), 22_500 * MS, W, 10, 4);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.retry_ms),
            (true, 10, 0, 0)
        );
        assert_eq!(put(o.change), state(20_000, 8, 4).unwrap());
        let o = consume(state(10_000, 0, 8), 22_500 * MS, W, 10, 5);
        assert_eq!(
            (o.allowed, o.count, o.remaining, o.change),
            (false, 6, 4, Change::Keep)
        );
    }

    #[test]
    fn a_refused_consume_answers_when_it_would_pass() {
        // Previous 8, limit 10, cost 6: the share of 8 must fall to 4, which
        // it does once 5 s are left (8 * 0.5 = 4; 8 * 0.5001 weighs 5).
        let o = consume(state(10_000, 0, 8), 22_500 * MS, W, 10, 6);
        assert_eq!((o.allowed, o.retry_ms, o.reset_ms), (false, 2_500, 7_500));
        assert!(consume(state(10_000, 0, 8), 25_000 * MS, W, 10, 6).allowed);
        assert!(!consume(state(10_000, 0, 8), 25_000 * MS - 1, W, 10, 6).allowed);
        // A cost of 5 waits until 8 * left / W is 5: 6.25 s left.
        assert_eq!(
            consume(state(10_000, 0, 8), 22_500 * MS, W, 10, 5).retry_ms,
            1_250
        );
        // The current window is over the limit on its own: it must end, and its
        // share fall to 10 - 5 = 5 out of 7 in the next window.
        let o = consume(state(20_000, 0, 7), 22_500 * MS, W, 10, 5);
        let at = 22_500 + o.retry_ms;
        assert!(consume(state(20_000, 0, 7), at * MS, W, 10, 5).allowed);
        assert!(!consume(state(20_000, 0, 7), (at - 1) * MS, W, 10, 5).allowed);
        // 7 * left / W <= 5 from left = 7,142,857 µs on.
        assert_eq!(
            o.retry_ms,
            (7_500_000 + 10_000_000 - 7_142_857u64).div_ceil(MS)
        );
    }

    #[test]
    fn consume_of_cost_zero_reads() {
        let o = consume(None, 0, W, 0, 0);
        assert_eq!((o.allowed, o.count, o.change), (true, 0, Change::Keep));
        let o = consume(state(10_000, 0, 8), 22_500 * MS, W, 6, 0);
        assert_eq!((o.allowed, o.count, o.change), (true, 6, Change::Keep));
        let o = consume(state(10_000, 0, 8), 22_500 * MS, W, 5, 0);
        assert_eq!((o.allowed, o.count, o.change), (false, 6, Change::Keep));
        assert!(o.retry_ms > 0);
    }

    #[test]
    fn a_cost_above_the_limit_never_passes() {
        let o = consume(None, 2_500 * MS, W, 3, 4);
        assert_eq!(
            (o.allowed, o.count, o.retry_ms, o.change),
            (false, 0, 7_500, Change::Keep)
        );
        let o = consume(state(0, 0, 2), 2_500 * MS, W, 3, 4);
        assert_eq!((o.allowed, o.count, o.retry_ms), (false, 2, 17_500));
    }

    #[test]
    fn checks() {
        assert_eq!(check(1.0, 0.0), Ok((1, 0)));
        assert_eq!(check(MAX_PERIOD_MS as f64, 1.0), Ok((MAX_PERIOD_MS, 1)));
        assert!(check(MAX_PERIOD_MS as f64 + 1.0, 1.0).is_err());
        assert!(check(0.0, 1.0).is_err());
        assert!(check(1.0, -1.0).is_err());
        assert!(check_consume(1.0, -1.0, 1.0).is_err());
        assert_eq!(check_consume(5.0, 3.0, 2.0), Ok((5, 3, 2)));
    }

    #[test]
    fn the_longest_window_stays_in_range() {
        let now = 1_770_000_000_000_000;
        let o = increment(None, now, MAX_PERIOD_MS, MAX_SAFE).unwrap();
        let s = put(o.change);
        assert!(s.start <= now && s.ends_at >= now);
        assert_eq!(
            o.reset_ms,
            (s.start + MAX_PERIOD_MS * MS - now).div_ceil(MS)
        );
    }

    /// Seed 004's rules as plainly as they read: a count for every aligned
    /// window that was ever hit.
    #[derive(Default)]
    struct SlidingModel(HashMap<(u8, u64), i64>);

    impl SlidingModel {
        fn at(&self, key: u8, now: u64, window_ms: u64) -> (i64, u64) {
            let window = window_ms * MS;
            let n = now / window;
            let left = window - now % window;
            let previous = n.checked_sub(1).map_or(0, |p| self.get(key, p));
            // The exact rational previous * left / window, rounded up.
            let share = (previous as u128 * left as u128).div_ceil(window as u128) as i64;
            (share + self.get(key, n), left)
        }
        fn get(&self, key: u8, n: u64) -> i64 {
            self.0.get(&(key, n)).copied().unwrap_or(0)
        }
        fn add(&mut self, key: u8, now: u64, window_ms: u64, amount: i64) {
            *self.0.entry((key, now / (window_ms * MS))).or_default() += amount;
        }
        fn decrement(
            &mut self,
            key: u8,
            now: u64,
            window_ms: u64,
            amount: i64,
            taken_in: Option<u64>,
        ) {
            let n = now / (window_ms * MS);
            let mut amount = amount;
            let windows = match taken_in {
                None => [Some(n), n.checked_sub(1)],
                // Only the take's own window, while it still counts.
                Some(end) => {
                    let w = end / (window_ms * MS) - 1;
                    [(w == n || w + 1 == n).then_some(w), None]
                }
            };
            for w in windows.into_iter().flatten() {
                let count = self.0.entry((key, w)).or_default();
                let taken = amount.min(*count);
                *count -= taken;
                amount -= taken;
            }
        }
        /// The first µs from `now` on at which the consume would pass, by trying each.
        fn wait(&self, key: u8, now: u64, window_ms: u64, limit: i64, cost: i64) -> u64 {
            (0..)
                .find(|d| self.at(key, now + d, window_ms).0 + cost <= limit)
                .unwrap()
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_model(
            ops in proptest::collection::vec((0u8..3, 0u64..3_000, 0u8..4, 0i64..6, 0i64..8), 1..150)
        ) {
            // One window length per key: a state belongs to one window length.
            let windows = [1, 3, 4];
            let mut stored: HashMap<u8, Sliding> = HashMap::new();
            let mut model = SlidingModel::default();
            let mut now = 5_000_000;
            // The window of each key's last take, which a decrement of op 3 names.
            let mut taken: HashMap<u8, u64> = HashMap::new();
            for (key, step, op, amount, limit) in ops {
                now += step;
                let window_ms = windows[key as usize];
                let held = stored.get(&key).copied();
                let (expected, left) = model.at(key, now, window_ms);
                let reset_ms = left.div_ceil(MS);
                let change = match op {
                    0 => {
                        let o = increment(held, now, window_ms, amount).unwrap();
                        model.add(key, now, window_ms, amount);
                        prop_assert_eq!(o.window, now - now % (window_ms * MS) + window_ms * MS);
                        taken.insert(key, o.window);
                        prop_assert_eq!((o.count, o.reset_ms), (expected + amount, reset_ms));
                        o.change
                    }
                    1 | 3 => {
                        let taken_in = if op == 3 { taken.get(&key).copied() } else { None };
                        let o = decrement(held, now, window_ms, amount, taken_in);
                        model.decrement(key, now, window_ms, amount, taken_in);
                        prop_assert_eq!((o.count, o.reset_ms), (model.at(key, now, window_ms).0, reset_ms));
                        o.change
                    }
                    _ => {
                        let o = consume(held, now, window_ms, limit, amount);
                        let allowed = expected + amount <= limit;
                        prop_assert_eq!((o.allowed, o.reset_ms), (allowed, reset_ms));
                        if allowed {
                            model.add(key, now, window_ms, amount);
                            taken.insert(key, o.window);
                            prop_assert_eq!((o.count, o.retry_ms), (expected + amount, 0));
                        } else if amount <= limit {
                            let wait = model.wait(key, now, window_ms, limit, amount);
                            prop_assert_eq!((o.count, o.retry_ms), (expected, wait.div_ceil(MS)));
                        }
                        prop_assert_eq!(o.remaining, (limit - o.count).clamp(0, limit));
                        o.change
                    }
                };
                match change {
                    Change::Keep => {}
                    Change::Put(s) => {
                        prop_assert!(s.ends_at > now);
                        stored.insert(key, s);
                    }
                    Change::Drop => {
                        stored.remove(&key);
                    }
                }
                // A state is kept only while it counts.
                if let Some(s) = stored.get(&key) {
                    prop_assert!(s.ends_at > now);
                }
            }
        }
    }
}
