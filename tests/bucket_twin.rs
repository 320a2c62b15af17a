//! `bucket.rs` and `bucket.lua` answer the same cases. The script reads the
//! server's clock itself, so each answer is checked against the Rust rules at
//! some µs between a TIME read before the script and one after it.

mod scripts;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratestore::bucket::{self, Bucket, Params};
use ratestore::redis::scripts::BUCKET_SUFFIX as KEY_SUFFIX;
use ratestore::window::{Change, MAX_PERIOD_MS, MAX_SAFE};
use redis::Commands;
use scripts::Redis;

const MS: u64 = 1000;
const SLACK_MS: u64 = 20;

fn params(capacity: i64, refill: i64, interval_ms: u64) -> Params {
    bucket::check(capacity as f64, refill as f64, interval_ms as f64, 0.0)
        .unwrap()
        .0
}

fn args(p: &Params, cost: i64) -> Vec<String> {
    [p.capacity, p.refill, p.interval_ms as i64, cost]
        .iter()
        .map(i64::to_string)
        .collect()
}

fn held(redis: &mut Redis, key: &[u8]) -> Option<(i64, u64, u64)> {
    // PTTL first: a state that expires between the two reads is then gone.
    let pttl: i64 = redis.con.pttl(key).unwrap();
    let fields: HashMap<String, i64> = redis.con.hgetall(key).unwrap();
    if fields.is_empty() || pttl < 0 {
        return None;
    }
    Some((fields["tokens"], fields["at"] as u64, pttl as u64))
}

fn same_kept(rust: Option<Bucket>, redis: Option<(i64, u64, u64)>, now: u64) -> bool {
    let rust = rust.filter(|b| b.ends_at > now);
    match (rust, redis) {
        (None, None) => true,
        (Some(b), Some((tokens, at, pttl))) => {
            let left = (b.ends_at - now).div_ceil(MS);
            // Redis keeps a state 1 ms longer than it counts, timed from a whole ms.
            (b.tokens, b.refilled_at) == (tokens, at) && pttl <= left + 2 && pttl + SLACK_MS >= left
        }
        (Some(b), None) => b.ends_at - now <= SLACK_MS * MS,
        // A bucket that has just filled, which Redis keeps a ms longer.
        (None, Some((.., pttl))) => pttl <= 2,
    }
}

/// Runs a take through the script, and finds a µs of the server's clock
/// during the script at which the Rust rules answer and keep the same.
fn twin_step(
    redis: &mut Redis,
    key: &[u8],
    stored: Option<Bucket>,
    p: &Params,
    cost: i64,
) -> Result<Option<Bucket>, String> {
    let before = redis.time_us();
    let lua = redis.run(ratestore::redis::scripts::BUCKET, &[key], &args(p, cost));
    let after = redis.time_us();
    let kept = held(redis, key);
    let mut tried = Vec::new();
    for now in before..=after {
        let o = bucket::take(stored, now, p, cost);
        let answer = vec![
            o.allowed as i64,
            o.remaining,
            o.retry_ms as i64,
            o.reset_ms as i64,
        ];
        let state = match o.change {
            Change::Put(b) => Some(b),
            Change::Keep => stored,
            Change::Drop => None,
        };
        if lua.as_ref() == Ok(&answer) && same_kept(state, kept, now) {
            return Ok(state);
        }
        if tried.len() < 3 {
            tried.push(answer);
        }
    }
    Err(format!(
        "take {cost} from {stored:?} ({p:?}): Lua answered {lua:?} and keeps {kept:?}; Rust from {before} µs answers {tried:?}"
    ))
}

fn put_in_redis(redis: &mut Redis, key: &[u8], state: Option<Bucket>, now: u64) {
    let _: () = redis.con.del(key).unwrap();
    if let Some(b) = state {
        let _: () = redis
            .con
            .hset_multiple(key, &[("tokens", b.tokens), ("at", b.refilled_at as i64)])
            .unwrap();
        let ttl = b.ends_at.saturating_sub(now).div_ceil(MS).max(1);
        let _: () = redis.con.pexpire(key, ttl as i64).unwrap();
    }
}

/// `(name, tokens and ms since the last refill (None: no state), bucket, cost)`.
type Case = (&'static str, Option<(i64, u64)>, Params, i64);

#[test]
fn bucket_rs_and_bucket_lua_agree() {
    let small = params(10, 2, 1_000);
    let cases: Vec<Case> = vec![
        ("a new bucket is full", None, small, 3),
        ("a read of a new bucket", None, small, 0),
        ("takes what it holds", Some((4, 300)), small, 4),
        ("refills whole intervals", Some((4, 2_300)), small, 8),
        ("refused, waits for enough", Some((1, 300)), small, 6),
        ("refused, cost above capacity", Some((1, 300)), small, 11),
        ("a new bucket, cost above capacity", None, small, 11),
        ("refilled to full is as new", Some((1, 9_000)), small, 1),
        ("a read of a part-full bucket", Some((3, 100)), small, 0),
        (
            "more tokens than the capacity",
            Some((12, 100)),
            params(10, 1, 1_000),
            1,
        ),
        (
            "a 30-day refill",
            Some((0, 1_000)),
            params(1, 1, 30 * 86_400_000),
            1,
        ),
        (
            "the largest bucket",
            None,
            params(MAX_SAFE, MAX_SAFE, MAX_PERIOD_MS),
            MAX_SAFE,
        ),
        ("a one-token bucket", Some((0, 0)), params(1, 1, 1), 1),
    ];
    let mut redis = Redis::connect("bucket");
    for (i, (name, stored, p, cost)) in cases.iter().enumerate() {
        let key = [redis.key(&format!("case:{i}")).as_bytes(), KEY_SUFFIX].concat();
        let now = redis.time_us();
        let state = stored.map(|(tokens, ago_ms)| {
            let refilled_at = now - ago_ms * MS;
            Bucket {
                tokens,
                refilled_at,
                // As the rules keep it: until full from the last refill, and on for a past one.
                ends_at: (refilled_at + (p.capacity - tokens).max(0) as u64 * p.interval_ms * MS)
                    .max(now + SLACK_MS * MS),
            }
        });
        put_in_redis(&mut redis, &key, state, now);
        if let Err(e) = twin_step(&mut redis, &key, state, p, *cost) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn the_script_refuses_what_is_not_its_state() {
    let mut redis = Redis::connect("bucket-refusals");
    let key = redis.key("other");
    let _: () = redis.con.hset(&key, "start", 3).unwrap();
    let reply = redis.run(
        ratestore::redis::scripts::BUCKET,
        &[key.as_bytes()],
        &args(&params(5, 1, 100), 1),
    );
    assert_eq!(reply, Err("NOTSTATE".into()));
    let _: () = redis.con.del(&key).unwrap();
    let _: () = redis.con.set(&key, 3).unwrap();
    let reply = redis.run(
        ratestore::redis::scripts::BUCKET,
        &[key.as_bytes()],
        &args(&params(5, 1, 100), 1),
    );
    assert_eq!(reply, Err("WRONGTYPE".into()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Random takes on one bucket with short intervals, so that real time
    /// refills it: each step's answer and state agree.
    #[test]
    fn random_sequences_agree(
        capacity in 1i64..8,
        refill in 1i64..4,
        interval_ms in 1u64..8,
        steps in proptest::collection::vec((0i64..5, 0u64..6), 1..40),
    ) {
        thread_local! {
            static REDIS: std::cell::RefCell<Redis> = std::cell::RefCell::new(Redis::connect("bucket-seq"));
        }
        let p = params(capacity, refill, interval_ms);
        REDIS.with_borrow_mut(|redis| -> Result<(), TestCaseError> {
            let key = [redis.key("seq").as_bytes(), KEY_SUFFIX].concat();
            let _: () = redis.con.del(&key).unwrap();
            let mut state = None;
            for (cost, pause_ms) in steps {
                std::thread::sleep(Duration::from_millis(pause_ms));
                state = twin_step(redis, &key, state, &p, cost).map_err(TestCaseError::fail)?;
            }
            Ok(())
        })?;
    }
}
