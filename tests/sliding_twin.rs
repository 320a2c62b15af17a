//! `sliding.rs` and `sliding.lua` answer the same cases. The script reads the
//! server's clock itself, so each answer is checked against the Rust rules at
//! some µs between a TIME read before the script and one after it.

mod scripts;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratestore::redis::scripts::SLIDING_SUFFIX as KEY_SUFFIX;
use ratestore::sliding::{self, Sliding};
use ratestore::window::{Change, MAX_SAFE};
use redis::Commands;
use scripts::Redis;

const MS: u64 = 1000;
/// Redis's clock runs on between the script and the read-back of a PTTL.
const SLACK_MS: u64 = 20;

#[derive(Clone, Copy, Debug)]
enum Op {
    Increment(i64),
    /// An amount, and the window it names (0: none; else a window's end in µs).
    Decrement(i64, u64),
    Consume {
        limit: i64,
        cost: i64,
    },
}

impl Op {
    fn args(self, window_ms: u64) -> Vec<String> {
        let (op, amount, limit) = match self {
            Op::Increment(a) => ("increment", a, None),
            Op::Decrement(a, w) => ("decrement", a, Some(w as i64)),
            Op::Consume { limit, cost } => ("consume", cost, Some(limit)),
        };
        let mut args = vec![op.to_string(), window_ms.to_string(), amount.to_string()];
        args.extend(limit.map(|l| l.to_string()));
        args
    }

    fn in_rust(
        self,
        stored: Option<Sliding>,
        now: u64,
        window_ms: u64,
    ) -> Result<(Vec<i64>, Change<Sliding>), String> {
        Ok(match self {
            Op::Increment(a) => {
                let o =
                    sliding::increment(stored, now, window_ms, a).map_err(|e| format!("{e:?}"))?;
                (vec![o.count, o.reset_ms as i64, o.window as i64], o.change)
            }
            Op::Decrement(a, w) => {
                let o = sliding::decrement(stored, now, window_ms, a, (w > 0).then_some(w));
                (vec![o.count, o.reset_ms as i64, o.window as i64], o.change)
            }
            Op::Consume { limit, cost } => {
                let o = sliding::consume(stored, now, window_ms, limit, cost);
                let answer = vec![
                    o.allowed as i64,
                    o.count,
                    o.remaining,
                    o.reset_ms as i64,
                    o.retry_ms as i64,
                    o.window as i64,
                ];
                (answer, o.change)
            }
        })
    }
}

fn apply(stored: Option<Sliding>, change: Change<Sliding>) -> Option<Sliding> {
    match change {
        Change::Put(s) => Some(s),
        Change::Keep => stored,
        Change::Drop => None,
    }
}

/// The state Redis holds for `key`, and its PTTL.
fn held(redis: &mut Redis, key: &[u8]) -> Option<(u64, i64, i64, u64)> {
    // PTTL first: a state that expires between the two reads is then gone.
    let pttl: i64 = redis.con.pttl(key).unwrap();
    let fields: HashMap<String, i64> = redis.con.hgetall(key).unwrap();
    if fields.is_empty() || pttl < 0 {
        return None;
    }
    Some((
        fields["start"] as u64,
        fields["previous"],
        fields["current"],
        pttl as u64,
    ))
}

fn put_in_redis(redis: &mut Redis, key: &[u8], state: Option<Sliding>, now: u64) {
    let _: () = redis.con.del(key).unwrap();
    if let Some(s) = state {
        let _: () = redis
            .con
            .hset_multiple(
                key,
                &[
                    ("start", s.start as i64),
                    ("previous", s.previous),
                    ("current", s.current),
                ],
            )
            .unwrap();
        let _: () = redis
            .con
            .pexpire(key, (s.ends_at - now).div_ceil(MS) as i64)
            .unwrap();
    }
}

/// Whether the Rust state kept after the script at `now` is what Redis holds.
fn same_kept(rust: Option<Sliding>, redis: Option<(u64, i64, i64, u64)>, now: u64) -> bool {
    let rust = rust.filter(|s| s.ends_at > now);
    match (rust, redis) {
        (None, None) => true,
        (Some(s), Some((start, previous, current, pttl))) => {
            let left = (s.ends_at - now).div_ceil(MS);
            // Redis keeps a state 1 ms longer than it counts, timed from a whole ms.
            (s.start, s.previous, s.current) == (start, previous, current)
                && pttl <= left + 2
                && pttl + SLACK_MS >= left
        }
        // A state about to end that Redis has already let go.
        (Some(s), None) => s.ends_at - now <= SLACK_MS * MS,
        // A state that has just stopped counting, which Redis keeps a ms longer.
        (None, Some((.., pttl))) => pttl <= 2,
    }
}

/// Runs `op` through the script, and finds a µs of the server's clock during
/// the script at which the Rust rules answer the same and keep the same.
/// Returns that time and what Rust keeps then.
fn twin_step(
    redis: &mut Redis,
    key: &[u8],
    stored: Option<Sliding>,
    window_ms: u64,
    op: Op,
) -> Result<(u64, Option<Sliding>), String> {
    let before = redis.time_us();
    let lua = redis.run(
        ratestore::redis::scripts::SLIDING,
        &[key],
        &op.args(window_ms),
    );
    let after = redis.time_us();
    let kept = held(redis, key);
    let mut tried = Vec::new();
    for now in before..=after {
        let rust = op.in_rust(stored, now, window_ms);
        let agrees = match (&rust, &lua) {
            (Ok((answer, change)), Ok(reply)) => {
                answer == reply && same_kept(apply(stored, *change), kept, now)
            }
            (Err(_), Err(code)) => code == "COUNTRANGE",
            _ => false,
        };
        if agrees {
            let state = rust.ok().and_then(|(_, change)| apply(stored, change));
            return Ok((now, state));
        }
        if tried.len() < 3 {
            tried.push(rust.map(|(answer, _)| answer));
        }
    }
    Err(format!(
        "{op:?} on {stored:?}: Lua answered {lua:?} and keeps {kept:?}; Rust from {before} µs answers {tried:?}"
    ))
}

/// A stored state, as windows back from the one the server's clock is in.
#[derive(Clone, Copy, Debug)]
enum Stored {
    Nothing,
    /// `windows_back`, previous, current.
    At(u64, i64, i64),
}

const W: u64 = 60_000;
/// A case's named window, resolved when it runs: `NAMED + n` is the end of
/// the window `n - 1` windows back from the current one (`NAMED`: the next one's).
const NAMED: u64 = 1 << 60;

/// The op with its named window resolved against `now`.
fn resolve(op: Op, now: u64, window_ms: u64) -> Op {
    let window = window_ms * MS;
    match op {
        Op::Decrement(a, w) if w >= NAMED => {
            let end = now - now % window + window;
            Op::Decrement(a, end + window - (w - NAMED) * window)
        }
        other => other,
    }
}

const CASES: &[(&str, Stored, Op)] = &[
    ("a new key", Stored::Nothing, Op::Increment(1)),
    ("a read of a new key", Stored::Nothing, Op::Increment(0)),
    (
        "adds in the current window",
        Stored::At(0, 4, 2),
        Op::Increment(3),
    ),
    (
        "reads the weighted estimate",
        Stored::At(0, 40, 2),
        Op::Increment(0),
    ),
    (
        "rotates a window on",
        Stored::At(1, 9, 30),
        Op::Increment(1),
    ),
    ("reads a window on", Stored::At(1, 9, 30), Op::Increment(0)),
    (
        "forgets an older window",
        Stored::At(2, 9, 30),
        Op::Increment(1),
    ),
    (
        "stops at the top of the range",
        Stored::At(0, 0, MAX_SAFE),
        Op::Increment(1),
    ),
    (
        "reaches the top of the range",
        Stored::At(0, 0, MAX_SAFE - 1),
        Op::Increment(1),
    ),
    (
        "a large previous count",
        Stored::At(1, 0, MAX_SAFE),
        Op::Increment(0),
    ),
    (
        "decrements the current window",
        Stored::At(0, 4, 2),
        Op::Decrement(1, 0),
    ),
    (
        "decrements into the previous",
        Stored::At(0, 4, 2),
        Op::Decrement(3, 0),
    ),
    (
        "decrements to nothing",
        Stored::At(0, 4, 2),
        Op::Decrement(99, 0),
    ),
    (
        "decrements a window on",
        Stored::At(1, 4, 2),
        Op::Decrement(1, 0),
    ),
    // A named window: as windows back from the current one, 1 for the current
    // (resolved to its end when the case runs).
    (
        "a decrement to its own window",
        Stored::At(0, 4, 2),
        Op::Decrement(3, NAMED + 1),
    ),
    (
        "a decrement to the window before",
        Stored::At(0, 4, 2),
        Op::Decrement(3, NAMED + 2),
    ),
    (
        "a decrement to an older window",
        Stored::At(0, 4, 2),
        Op::Decrement(3, NAMED + 3),
    ),
    (
        "a decrement to a later window",
        Stored::At(0, 4, 2),
        Op::Decrement(3, NAMED),
    ),
    (
        "a late decrement finds its window a window on",
        Stored::At(1, 4, 2),
        Op::Decrement(1, NAMED + 2),
    ),
    (
        "a large previous count, rounded up",
        Stored::At(1, 0, MAX_SAFE - 2),
        Op::Consume {
            limit: MAX_SAFE,
            cost: 1,
        },
    ),
    (
        "refuses on a large previous count",
        Stored::At(0, MAX_SAFE - 3, 0),
        Op::Consume {
            limit: MAX_SAFE - 7,
            cost: 3,
        },
    ),
    (
        "a decrement creates nothing",
        Stored::Nothing,
        Op::Decrement(1, 0),
    ),
    (
        "consumes within the limit",
        Stored::At(0, 10, 2),
        Op::Consume { limit: 20, cost: 3 },
    ),
    (
        "refuses on the previous window",
        Stored::At(0, 1_000, 2),
        Op::Consume { limit: 20, cost: 3 },
    ),
    (
        "refuses on the current window",
        Stored::At(0, 0, 19),
        Op::Consume { limit: 20, cost: 3 },
    ),
    (
        "refuses a cost above the limit",
        Stored::At(0, 0, 1),
        Op::Consume { limit: 2, cost: 3 },
    ),
    (
        "a cost above the limit, new key",
        Stored::Nothing,
        Op::Consume { limit: 2, cost: 3 },
    ),
    (
        "a consume of 0 reads",
        Stored::At(0, 4, 2),
        Op::Consume { limit: 20, cost: 0 },
    ),
    (
        "a consume of 0 over the limit",
        Stored::At(0, 4, 30),
        Op::Consume { limit: 20, cost: 0 },
    ),
    (
        "limit 0",
        Stored::Nothing,
        Op::Consume { limit: 0, cost: 0 },
    ),
    (
        "the whole range",
        Stored::Nothing,
        Op::Consume {
            limit: MAX_SAFE,
            cost: MAX_SAFE,
        },
    ),
];

#[test]
fn sliding_rs_and_sliding_lua_agree() {
    let mut redis = Redis::connect("sliding");
    for (i, (name, stored, op)) in CASES.iter().enumerate() {
        let key = [redis.key(&format!("case:{i}")).as_bytes(), KEY_SUFFIX].concat();
        let now = redis.time_us();
        let window = W * MS;
        let state = match *stored {
            Stored::Nothing => None,
            Stored::At(back, previous, current) => {
                let start = now - now % window - back * window;
                Some(Sliding {
                    start,
                    previous,
                    current,
                    // A state older than its window (kept under another windowMs) lives on.
                    ends_at: (start + 2 * window).max(now + window),
                })
            }
        };
        put_in_redis(&mut redis, &key, state, now);
        if let Err(e) = twin_step(&mut redis, &key, state, W, resolve(*op, now, W)) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn the_script_refuses_what_is_not_its_state() {
    let mut redis = Redis::connect("sliding-refusals");
    let key = redis.key("other");
    let _: () = redis.con.hset(&key, "tokens", 3).unwrap();
    let reply = redis.run(
        ratestore::redis::scripts::SLIDING,
        &[key.as_bytes()],
        &Op::Increment(1).args(W),
    );
    assert_eq!(reply, Err("NOTSTATE".into()));
    let _: () = redis.con.del(&key).unwrap();
    let _: () = redis.con.set(&key, 3).unwrap();
    let reply = redis.run(
        ratestore::redis::scripts::SLIDING,
        &[key.as_bytes()],
        &Op::Increment(1).args(W),
    );
    assert_eq!(reply, Err("WRONGTYPE".into()));
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..4).prop_map(Op::Increment),
        (0i64..3, 0u64..4).prop_map(|(a, w)| Op::Decrement(a, if w == 0 { 0 } else { NAMED + w })),
        (0i64..10, 0i64..4).prop_map(|(limit, cost)| Op::Consume { limit, cost }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Random sequences on one key with short windows, so that real time
    /// carries them across window edges: each step's answer and state agree.
    #[test]
    fn random_sequences_agree(
        window_ms in 2u64..12,
        steps in proptest::collection::vec((op(), 0u64..6), 1..40),
    ) {
        thread_local! {
            static REDIS: std::cell::RefCell<Redis> = std::cell::RefCell::new(Redis::connect("sliding-seq"));
        }
        REDIS.with_borrow_mut(|redis| -> Result<(), TestCaseError> {
            let key = [redis.key("seq").as_bytes(), KEY_SUFFIX].concat();
            let _: () = redis.con.del(&key).unwrap();
            let mut state = None;
            for (op, pause_ms) in steps {
                std::thread::sleep(Duration::from_millis(pause_ms));
                let op = resolve(op, redis.time_us(), window_ms);
                match twin_step(redis, &key, state, window_ms, op) {
                    Ok((_, kept)) => state = kept,
                    Err(e) => return Err(TestCaseError::fail(e)),
                }
            }
            Ok(())
        })?;
    }
}

/// sliding.lua's muldiv on its own: `floor(a * b / d)` and the remainder,
/// exactly, across the whole range (products far past 2^53 included).
fn muldiv_in_lua(redis: &mut Redis, a: u64, b: u64, d: u64) -> Vec<i64> {
    let script = ratestore::redis::scripts::SLIDING;
    let body =
        &script[script.find("-- BEGIN muldiv").unwrap()..script.find("-- END muldiv").unwrap()];
    let script = format!(
        "{body}\nlocal q, r = muldiv(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))\nreturn {{ q, r }}"
    );
    redis
        .run(&script, &[], &[a.to_string(), b.to_string(), d.to_string()])
        .unwrap()
}

fn muldiv(a: u64, b: u64, d: u64) -> Vec<i64> {
    let p = a as u128 * b as u128;
    vec![(p / d as u128) as i64, (p % d as u128) as i64]
}

#[test]
fn muldiv_is_exact_at_the_edges_of_the_range() {
    let mut redis = Redis::connect("sliding-muldiv");
    let top = MAX_SAFE as u64;
    let period = (1u64 << 52) - 1;
    for (a, b, d) in [
        (0, top, 1),
        (top - 1, top, top),
        (top - 2, top - 1, top),
        (period - 1, top, period),
        (1, top, 2),
        (3, top, 7),
        (123_456_789, top - 12, 987_654_321_012),
        (period / 3, period, period),
        (1 << 26, 1 << 27, (1 << 26) + 1),
    ] {
        assert_eq!(
            muldiv_in_lua(&mut redis, a, b, d),
            muldiv(a, b, d),
            "{a} * {b} / {d}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn muldiv_is_exact(d in 1u64..=MAX_SAFE as u64, a_of in 0.0f64..1.0, b in 0u64..=MAX_SAFE as u64) {
        thread_local! {
            static REDIS: std::cell::RefCell<Redis> = std::cell::RefCell::new(Redis::connect("sliding-muldiv-seq"));
        }
        let a = ((d as f64 * a_of) as u64).min(d - 1);
        REDIS.with_borrow_mut(|redis| -> Result<(), TestCaseError> {
            prop_assert_eq!(muldiv_in_lua(redis, a, b, d), muldiv(a, b, d), "{} * {} / {}", a, b, d);
            Ok(())
        })?;
    }
}
