//! The token bucket: `capacity` tokens, `refill` more every `interval_ms`
//! (counted from the bucket's last refill), `cost` tokens per take.
//! `redis::scripts::BUCKET` (`bucket.lua`) is the twin, run by Redis on the server's TIME.
//!
//! Refills come whole, every interval, as in @upstash/ratelimit's bucket:
//! with a refill of 1 this is the smooth one-token-at-a-time bucket, and the
//! arithmetic stays exact in integers (Lua's doubles included), where a
//! fractional rate would round differently in each twin. A bucket that has
//! refilled to capacity is the same as no state at all, so a key is kept
//! only until it is full again. Time is in µs on the caller's clock.

use crate::errors::{Error, Result};
use crate::window::{self, Change, MAX_PERIOD_MS};

const US_PER_MS: u64 = 1000;

/// A bucket's parameters, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub capacity: i64,
    pub refill: i64,
    pub interval_ms: u64,
}

/// The state kept for a key that is not full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub tokens: i64,
    /// When the bucket last refilled (or was taken from full), in µs.
    pub refilled_at: u64,
    /// When it will be full again, so that it may be dropped: Redis's PTTL.
    pub ends_at: u64,
}

/// The answer of a take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Whether the bucket held `cost` tokens, so that they were taken.
    pub allowed: bool,
    /// Tokens left after this take.
    pub remaining: i64,
    /// 0 when allowed; else whole ms until the bucket holds `cost` tokens. A
    /// cost above the capacity never fits: then the ms until it is full, at least 1.
    pub retry_ms: u64,
    /// Whole ms until the bucket is full; 0 when it is.
    pub reset_ms: u64,
    pub change: Change<Bucket>,
}

/// Checks a bucket and a cost. Filling from empty must take at most
/// [`MAX_PERIOD_MS`], so that every time the twins compute stays exact.
pub fn check(capacity: f64, refill: f64, interval_ms: f64, cost: f64) -> Result<(Params, i64)> {
    let positive = |n: f64, message| {
        window::is_positive_safe_integer(n)
            .then_some(n as i64)
            .ok_or(Error::InvalidRange(message))
    };
    let capacity = positive(capacity, "capacity must be a positive safe integer")?;
    let refill = positive(refill, "refill must be a positive safe integer")?;
    let interval_ms = positive(interval_ms, "intervalMs must be a positive safe integer")? as u64;
    let cost = window::non_negative_safe_integer(cost).ok_or(Error::InvalidRange(
        "cost must be a safe integer of 0 or more",
    ))?;
    let refills = ceil_div(capacity, refill) as u64;
    if refills.saturating_mul(interval_ms) > MAX_PERIOD_MS {
        return Err(Error::InvalidRange(
            "a token bucket must fill from empty within 4503599627370 ms (capacity / refill * intervalMs)",
        ));
    }
    Ok((
        Params {
            capacity,
            refill,
            interval_ms,
        },
        cost,
    ))
}

/// `a / b` rounded up, for `a >= 0` and `b > 0` (`i64::div_ceil` is unstable).
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}

/// Tokens at `now` and the time the refills count from.
fn view(stored: Option<Bucket>, now: u64, p: &Params) -> (i64, u64) {
    let interval = p.interval_ms * US_PER_MS;
    let Some(b) = stored else {
        return (p.capacity, now);
    };
    let missing = p.capacity - b.tokens;
    if missing <= 0 {
        return (p.capacity, now);
    }
    // A clock set back (Redis's) refills nothing until it passes `refilled_at` again.
    let refills = now.saturating_sub(b.refilled_at) / interval;
    if refills >= ceil_div(missing, p.refill) as u64 {
        return (p.capacity, now);
    }
    (
        b.tokens + refills as i64 * p.refill,
        b.refilled_at + refills * interval,
    )
}

/// When a bucket at `tokens`, refilling from `at`, holds `want` tokens.
fn holds_at(tokens: i64, at: u64, want: i64, p: &Params) -> u64 {
    let refills = ceil_div((want - tokens).max(0), p.refill) as u64;
    at + refills * p.interval_ms * US_PER_MS
}

/// Takes `cost` tokens if the bucket holds them. A refused take, and one of
/// cost 0 (a read), change nothing.
pub fn take(stored: Option<Bucket>, now: u64, p: &Params, cost: i64) -> Taken {
    let (tokens, at) = view(stored, now, p);
    let ms_until = |t: u64| t.saturating_sub(now).div_ceil(US_PER_MS);
    if cost <= tokens {
        let remaining = tokens - cost;
        let ends_at = holds_at(remaining, at, p.capacity, p);
        let change = if cost == 0 {
            Change::Keep
        } else {
            Change::Put(Bucket {
                tokens: remaining,
                refilled_at: at,
                ends_at,
            })
        };
        return Taken {
            allowed: true,
            remaining,
            retry_ms: 0,
            reset_ms: ms_until(ends_at),
            change,
        };
    }
    let reset_ms = ms_until(holds_at(tokens, at, p.capacity, p));
    let retry_ms = if cost > p.capacity {
        reset_ms.max(1)
    } else {
        ms_until(holds_at(tokens, at, cost, p))
    };
    Taken {
        allowed: false,
        remaining: tokens,
        retry_ms,
        reset_ms,
        change: Change::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const MS: u64 = 1000;

    fn params(capacity: i64, refill: i64, interval_ms: u64) -> Params {
        check(capacity as f64, refill as f64, interval_ms as f64, 0.0)
            .unwrap()
            .0
    }

    fn put(change: Change<Bucket>) -> Bucket {
        match change {
            Change::Put(b) => b,
            other => panic!("expected a Put, got {other:?}"),
        }
    }

    #[test]
    fn a_new_bucket_is_full() {
        let p = params(10, 1, 1_000);
        let o = take(None, 5 * MS, &p, 3);
        assert_eq!(
            (o.allowed, o.remaining, o.retry_ms, o.reset_ms),
            (true, 7, 0, 3_000)
        );
        assert_eq!(
            put(o.change),
            Bucket {
                tokens: 7,
                refilled_at: 5 * MS,
                ends_at: 3_005 * MS
            }
        );
        let o = take(None, 0, &p, 0);
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.change),
            (true, 10, 0, Change::Keep)
        );
    }

    #[test]
    fn a_burst_of_the_capacity_passes_and_no_more() {
        let p = params(5, 1, 1_000);
        let mut b = None;
        for left in (0..5).rev() {
            let o = take(b, 0, &p, 1);
            assert_eq!((o.allowed, o.remaining), (true, left));
            b = Some(put(o.change));
        }
        let o = take(b, 0, &p, 1);
        assert_eq!(
            (o.allowed, o.remaining, o.retry_ms, o.reset_ms),
            (false, 0, 1_000, 5_000)
        );
    }

    #[test]
    fn refills_come_whole_every_interval() {
        let p = params(10, 3, 1_000);
        let b = put(take(None, 0, &p, 10).change);
        let o = take(Some(b), 999_999, &p, 0);
        assert_eq!((o.remaining, o.reset_ms), (0, 3_001));
        let o = take(Some(b), 2_500 * MS, &p, 0);
        assert_eq!((o.remaining, o.reset_ms), (6, 1_500));
        // Taking keeps the refills' phase.
        let o = take(Some(b), 2_500 * MS, &p, 6);
        assert_eq!(put(o.change).refilled_at, 2_000 * MS);
        assert_eq!(o.reset_ms, 3_500);
        // Full again: as new, with a new phase.
        let o = take(Some(b), 4_000 * MS, &p, 1);
        assert_eq!((o.remaining, put(o.change).refilled_at), (9, 4_000 * MS));
    }

    #[test]
    fn a_refused_take_says_when_enough_tokens_are_in() {
        let p = params(10, 2, 500);
        let b = put(take(None, 0, &p, 9).change);
        let o = take(Some(b), 100 * MS, &p, 6);
        // 1 token now, 5 more needed: 3 refills of 2, the last at 1,500 ms.
        assert_eq!(
            (o.allowed, o.remaining, o.retry_ms, o.reset_ms),
            (false, 1, 1_400, 2_400)
        );
        assert_eq!(o.change, Change::Keep);
        assert!(take(Some(b), 1_500 * MS, &p, 6).allowed);
        assert!(!take(Some(b), 1_500 * MS - 1, &p, 6).allowed);
    }

    #[test]
    fn a_cost_above_the_capacity_never_fits() {
        let p = params(3, 1, 1_000);
        let o = take(None, 0, &p, 4);
        assert_eq!(
            (o.allowed, o.remaining, o.retry_ms, o.reset_ms),
            (false, 3, 1, 0)
        );
        let b = put(take(None, 0, &p, 2).change);
        let o = take(Some(b), 0, &p, 4);
        assert_eq!((o.allowed, o.retry_ms, o.reset_ms), (false, 2_000, 2_000));
    }

    #[test]
    fn a_smaller_capacity_caps_the_tokens() {
        let b = put(take(None, 0, &params(10, 1, 1_000), 1).change);
        let o = take(Some(b), 0, &params(5, 1, 1_000), 0);
        assert_eq!((o.remaining, o.reset_ms), (5, 0));
    }

    #[test]
    fn a_clock_set_back_refills_nothing() {
        let p = params(10, 1, 1_000);
        let b = put(take(None, 50_000 * MS, &p, 4).change);
        let o = take(Some(b), 40_000 * MS, &p, 0);
        assert_eq!((o.remaining, o.reset_ms), (6, 14_000));
    }

    #[test]
    fn checks() {
        assert!(check(0.0, 1.0, 1.0, 1.0).is_err());
        assert!(check(1.0, 0.0, 1.0, 1.0).is_err());
        assert!(check(1.0, 1.0, 0.5, 1.0).is_err());
        assert!(check(1.0, 1.0, 1.0, -1.0).is_err());
        assert!(check(2.0, 1.0, MAX_PERIOD_MS as f64 / 2.0, 0.0).is_ok());
        assert!(check(3.0, 1.0, MAX_PERIOD_MS as f64 / 2.0, 0.0).is_err());
        let max = window::MAX_SAFE as f64;
        assert!(check(max, max, 1.0, max).is_ok());
        assert!(check(max, 1.0, 1.0, 0.0).is_err());
    }

    #[test]
    fn the_largest_bucket_stays_exact() {
        let max = window::MAX_SAFE;
        let p = params(max, max, MAX_PERIOD_MS);
        let now = 1_770_000_000_000_000;
        let o = take(None, now, &p, max);
        assert_eq!((o.remaining, o.reset_ms), (0, MAX_PERIOD_MS));
        let o = take(Some(put(o.change)), now + MAX_PERIOD_MS * MS - 1, &p, 1);
        assert_eq!((o.allowed, o.retry_ms), (false, 1));
    }

    /// A bucket as plainly as it reads: tokens and the time of the last
    /// refill, refilled one interval at a time.
    #[derive(Default)]
    struct BucketModel(HashMap<u8, (i64, u64)>);

    impl BucketModel {
        fn at(&mut self, key: u8, now: u64, p: &Params) -> (i64, u64) {
            let (mut tokens, mut at) = self.0.get(&key).copied().unwrap_or((p.capacity, now));
            while tokens < p.capacity && at + p.interval_ms * MS <= now {
                tokens = (tokens + p.refill).min(p.capacity);
                at += p.interval_ms * MS;
            }
            if tokens >= p.capacity {
                (tokens, at) = (p.capacity, now);
            }
            (tokens, at)
        }
        /// The first ms from `now` on at which `want` tokens are in, by trying each.
        fn wait_ms(&mut self, key: u8, now: u64, p: &Params, want: i64) -> u64 {
            let saved = self.0.get(&key).copied();
            let ms = (0..)
                .find(|ms| self.at(key, now + ms * MS, p).0 >= want)
                .unwrap();
            if let Some(s) = saved {
                self.0.insert(key, s);
            }
            ms
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_model(
            ops in proptest::collection::vec((0u8..3, 0u64..2_500_000, 0i64..6), 1..150)
        ) {
            let buckets = [params(5, 1, 300), params(7, 3, 1_000), params(1, 1, 50)];
            let mut stored: HashMap<u8, Bucket> = HashMap::new();
            let mut model = BucketModel::default();
            let mut now = 1_000_000;
            for (key, step, cost) in ops {
                now += step;
                let p = buckets[key as usize];
                let o = take(stored.get(&key).copied(), now, &p, cost);
                let (tokens, at) = model.at(key, now, &p);
                prop_assert_eq!(o.allowed, cost <= tokens);
                if o.allowed {
                    prop_assert_eq!(o.remaining, tokens - cost);
                    if cost > 0 {
                        model.0.insert(key, (tokens - cost, at));
                    }
                } else {
                    prop_assert_eq!(o.remaining, tokens);
                    if cost <= p.capacity {
                        prop_assert_eq!(o.retry_ms, model.wait_ms(key, now, &p, cost));
                    }
                }
                prop_assert_eq!(o.reset_ms, model.wait_ms(key, now, &p, p.capacity));
                match o.change {
                    Change::Keep => {}
                    Change::Put(b) => {
                        prop_assert!(b.ends_at > now);
                        stored.insert(key, b);
                    }
                    Change::Drop => {
                        stored.remove(&key);
                    }
                }
            }
        }
    }
}
