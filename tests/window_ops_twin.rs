//! `window::consume` and `window::refund` and their Lua twins
//! (`window_consume.lua`, `window_refund.lua`) answer the same cases, and keep
//! the same counter, as `hit` and `window.lua` do on the same key.

mod scripts;
mod support;

use std::time::{Duration, Instant};

use proptest::prelude::*;
use ratestore::window::{self, Change, Counter, MAX_SAFE};
use redis::Commands;
use scripts::Redis;

const MS: u64 = 1000;
const NOW: u64 = 1_000_000 * MS;
/// Redis's clock runs on between the set-up, the script and the read-back.
const SLACK_MS: u64 = 20;

#[derive(Clone, Copy, Debug)]
enum Stored {
    Nothing,
    /// A window with this count and this many ms left.
    Open(i64, u64),
    /// A counter without a TTL.
    NoTtl(i64),
    /// A window with under 1 ms left.
    Ending(i64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Consume {
        window_ms: u64,
        limit: i64,
        cost: i64,
    },
    Refund(i64),
    /// A refund naming a window: the open one's id (true) or another's.
    RefundTo(i64, bool),
}

/// The answer as numbers: consume's `[allowed, count, remaining, resetMs]`,
/// refund's `[count, resetMs]`; the last is in ms.
type Answer = Vec<i64>;
/// What the key holds afterwards: count and ms left.
type Kept = Option<(i64, u64)>;

fn counter(stored: Stored) -> Option<Counter> {
    let (count, ends_at) = match stored {
        Stored::Nothing => return None,
        Stored::Open(count, left) => (count, NOW + left * MS),
        Stored::NoTtl(count) => (count, NOW - MS),
        Stored::Ending(count) => (count, NOW + MS / 2),
    };
    Some(Counter {
        count,
        ends_at,
        long: false,
    })
}

fn apply(stored: Option<Counter>, change: Change, now: u64) -> Kept {
    let kept = match change {
        Change::Put(c) => Some(c),
        Change::Keep => stored,
        Change::Drop => None,
    };
    kept.and_then(|c| c.reset_ms(now).map(|left| (c.count, left)))
}

fn in_rust(stored: Option<Counter>, now: u64, op: Op) -> (Answer, Kept) {
    match op {
        Op::Consume {
            window_ms,
            limit,
            cost,
        } => {
            let o = window::consume(stored, now, window_ms, limit, cost);
            // The id is the end of the window counted in, 0 with none open.
            let kept = apply(stored, o.change, now);
            let open = match o.change {
                Change::Put(c) => Some(c),
                _ => stored.filter(|c| c.reset_ms(now).is_some()),
            };
            assert_eq!(o.window, open.map_or(0, |c| c.window()));
            let answer = vec![o.allowed as i64, o.count, o.remaining, o.reset_ms as i64];
            (answer, kept)
        }
        Op::Refund(amount) => {
            let o = window::refund(stored, now, amount);
            (
                vec![o.count, o.reset_ms as i64],
                apply(stored, o.change, now),
            )
        }
        Op::RefundTo(amount, own) => {
            let id = stored.map_or(1, |c| c.window() + u64::from(!own));
            let o = window::refund_to(stored, now, amount, Some(id));
            (
                vec![o.count, o.reset_ms as i64],
                apply(stored, o.change, now),
            )
        }
    }
}

fn in_redis(redis: &mut Redis, key: &str, op: Op) -> Result<Answer, String> {
    match op {
        Op::Consume {
            window_ms,
            limit,
            cost,
        } => {
            let mut answer = redis.run(
                ratestore::redis::scripts::WINDOW_CONSUME,
                &[key.as_bytes()],
                &[window_ms.to_string(), limit.to_string(), cost.to_string()],
            )?;
            // The id: the open window's expiry (which stays put while it is open), 0 with none.
            let id = answer.pop();
            let expiry = expire_time(redis, key);
            assert!(
                id == Some(0) || expiry == 0 || id == Some(expiry),
                "{id:?} {expiry}"
            );
            Ok(answer)
        }
        Op::Refund(amount) => redis.run(
            ratestore::redis::scripts::WINDOW_REFUND,
            &[key.as_bytes()],
            &[amount.to_string()],
        ),
        Op::RefundTo(amount, own) => {
            let id = expire_time(redis, key).max(0) + i64::from(!own);
            redis.run(
                ratestore::redis::scripts::WINDOW_REFUND,
                &[key.as_bytes()],
                &[amount.to_string(), id.max(1).to_string()],
            )
        }
    }
}

fn expire_time(redis: &mut Redis, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query::<i64>(&mut redis.con)
        .unwrap()
        .max(0)
}

fn kept_in_redis(redis: &mut Redis, key: &str) -> Kept {
    let count: Option<i64> = redis.con.get(key).unwrap();
    let pttl: i64 = redis.con.pttl(key).unwrap();
    count.filter(|_| pttl > 0).map(|n| (n, pttl as u64))
}

/// Rust's time is read before each call to Redis, so either side may have
/// the more left: Redis by as much as its call that opened the window ran
/// later after Rust's reading than this one did.
fn close_ms(rust: u64, redis: u64) -> bool {
    rust.abs_diff(redis) <= SLACK_MS
}

/// Same numbers, the last (ms left) within the slack.
fn same_answer(rust: &Answer, redis: &Answer) -> bool {
    let n = rust.len();
    n == redis.len()
        && rust[..n - 1] == redis[..n - 1]
        && (rust[n - 1] == redis[n - 1] || close_ms(rust[n - 1] as u64, redis[n - 1] as u64))
}

fn same_kept(rust: Kept, redis: Kept) -> bool {
    match (rust, redis) {
        (Some((rc, rl)), Some((dc, dl))) => rc == dc && close_ms(rl, dl),
        (None, None) => true,
        // A window of a few ms that ended before it was read back.
        (Some((_, left)), None) => left <= SLACK_MS,
        (None, Some(_)) => false,
    }
}

const fn consume(window_ms: u64, limit: i64, cost: i64) -> Op {
    Op::Consume {
        window_ms,
        limit,
        cost,
    }
}

const CASES: &[(&str, Stored, Op)] = &[
    (
        "a new key opens a window at cost",
        Stored::Nothing,
        consume(60_000, 10, 3),
    ),
    (
        "a new key, cost 0, opens none",
        Stored::Nothing,
        consume(60_000, 10, 0),
    ),
    (
        "a new key, limit 0, cost 0",
        Stored::Nothing,
        consume(60_000, 0, 0),
    ),
    (
        "a new key, cost above the limit",
        Stored::Nothing,
        consume(60_000, 2, 3),
    ),
    (
        "adds up to the limit",
        Stored::Open(7, 30_000),
        consume(60_000, 10, 3),
    ),
    (
        "refuses past the limit",
        Stored::Open(8, 30_000),
        consume(60_000, 10, 3),
    ),
    (
        "reads at the limit",
        Stored::Open(10, 30_000),
        consume(60_000, 10, 0),
    ),
    (
        "reads over the limit",
        Stored::Open(11, 30_000),
        consume(60_000, 10, 0),
    ),
    (
        "keeps the window's end",
        Stored::Open(1, 30_000),
        consume(1_000, 10, 1),
    ),
    (
        "a count below 0",
        Stored::Open(-5, 30_000),
        consume(60_000, 3, 2),
    ),
    (
        "restarts a counter with no TTL",
        Stored::NoTtl(9),
        consume(10_000, 10, 4),
    ),
    (
        "under 1 ms left is ended",
        Stored::Ending(9),
        consume(5_000, 10, 4),
    ),
    (
        "refused at the edge opens nothing",
        Stored::Ending(9),
        consume(5_000, 3, 4),
    ),
    (
        "the whole range",
        Stored::Open(0, 60_000),
        consume(60_000, MAX_SAFE, MAX_SAFE),
    ),
    (
        "just past the whole range",
        Stored::Open(1, 60_000),
        consume(60_000, MAX_SAFE, MAX_SAFE),
    ),
    (
        "a 30-day window",
        Stored::Nothing,
        consume(30 * 24 * 3_600_000, 5, 5),
    ),
    (
        "refunds within a window",
        Stored::Open(5, 30_000),
        Op::Refund(2),
    ),
    (
        "refunds down to 0, no further",
        Stored::Open(5, 30_000),
        Op::Refund(9),
    ),
    (
        "a refund of 0 reads",
        Stored::Open(5, 30_000),
        Op::Refund(0),
    ),
    (
        "a refund leaves a count below 0",
        Stored::Open(-2, 30_000),
        Op::Refund(1),
    ),
    ("a refund opens no window", Stored::Nothing, Op::Refund(3)),
    (
        "a refund to its own window",
        Stored::Open(5, 30_000),
        Op::RefundTo(2, true),
    ),
    (
        "a refund to another window changes nothing",
        Stored::Open(5, 30_000),
        Op::RefundTo(2, false),
    ),
    (
        "a refund to a window with none open",
        Stored::Nothing,
        Op::RefundTo(2, true),
    ),
    (
        "a refund after the window ended",
        Stored::Ending(5),
        Op::Refund(3),
    ),
    (
        "a refund on a counter with no TTL",
        Stored::NoTtl(5),
        Op::Refund(3),
    ),
    (
        "a refund of the whole range",
        Stored::Open(MAX_SAFE, 30_000),
        Op::Refund(MAX_SAFE),
    ),
];

fn set_up(redis: &mut Redis, key: &str, stored: Stored) {
    let _: () = redis.con.del(key).unwrap();
    match stored {
        Stored::Nothing => {}
        Stored::Open(count, left) => redis.con.pset_ex(key, count, left).unwrap(),
        Stored::NoTtl(count) => redis.con.set(key, count).unwrap(),
        Stored::Ending(count) => {
            redis.con.pset_ex::<_, _, ()>(key, count, 1).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
    }
}

#[test]
fn consume_and_refund_agree_with_their_scripts() {
    let mut redis = Redis::connect("window-ops");
    for (i, (name, stored, op)) in CASES.iter().enumerate() {
        let key = redis.key(&format!("case:{i}"));
        let (rust, rust_kept) = in_rust(counter(*stored), NOW, *op);
        set_up(&mut redis, &key, *stored);
        let answer = in_redis(&mut redis, &key, *op).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            same_answer(&rust, &answer),
            "{name}: Rust {rust:?}, Lua {answer:?}"
        );
        let kept = kept_in_redis(&mut redis, &key);
        assert!(
            same_kept(rust_kept, kept),
            "{name}: Rust keeps {rust_kept:?}, Redis {kept:?}"
        );
    }
}

#[test]
fn the_scripts_refuse_what_is_not_a_counter() {
    let mut redis = Redis::connect("window-ops-refusals");
    let key = redis.key("not-a-counter");
    for value in ["1.5", "abc"] {
        let _: () = redis.con.pset_ex(&key, value, 60_000).unwrap();
        assert_eq!(
            in_redis(&mut redis, &key, consume(60_000, 10, 1)),
            Err("NOTCOUNTER".into())
        );
        assert_eq!(
            in_redis(&mut redis, &key, Op::Refund(1)),
            Err("NOTCOUNTER".into())
        );
        let _: () = redis.con.set(&key, value).unwrap();
        assert_eq!(
            in_redis(&mut redis, &key, consume(60_000, 10, 1)),
            Err("NOTCOUNTER".into())
        );
    }
    let _: () = redis.con.del(&key).unwrap();
    let _: () = redis.con.hset(&key, "f", 1).unwrap();
    let _: () = redis.con.pexpire(&key, 60_000).unwrap();
    assert_eq!(
        in_redis(&mut redis, &key, consume(60_000, 10, 1)),
        Err("WRONGTYPE".into())
    );
}

/// One step of a random sequence: `hit` (the contract's), consume or refund.
#[derive(Clone, Copy, Debug)]
enum Step {
    Hit(i64),
    Op(Op),
    /// The key's window ends (deleted on Redis, dropped in Rust).
    End,
}

fn step() -> impl Strategy<Value = (usize, Step)> {
    let step = prop_oneof![
        (-3i64..4).prop_map(Step::Hit),
        (0i64..12, 0i64..5).prop_map(|(limit, cost)| Step::Op(consume(60_000, limit, cost))),
        (0i64..4).prop_map(|amount| Step::Op(Op::Refund(amount))),
        (0i64..4, any::<bool>()).prop_map(|(amount, own)| Step::Op(Op::RefundTo(amount, own))),
        Just(Step::End),
    ];
    (0usize..3, step)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random sequences of hit, consume and refund on a few keys: the Rust
    /// rules, applied to their own state, answer what the scripts answer.
    #[test]
    fn random_sequences_agree(steps in proptest::collection::vec(step(), 1..60)) {
        thread_local! {
            static REDIS: std::cell::RefCell<Redis> = std::cell::RefCell::new(Redis::connect("window-ops-seq"));
        }
        REDIS.with_borrow_mut(|redis| -> Result<(), TestCaseError> {
            let keys: Vec<String> = (0..3).map(|i| redis.key(&format!("seq:{i}"))).collect();
            for key in &keys {
                let _: () = redis.con.del(key).unwrap();
            }
            let mut held: [Option<Counter>; 3] = [None; 3];
            let started = Instant::now();
            for (k, step) in steps {
                let now = NOW + started.elapsed().as_micros() as u64;
                let key = &keys[k];
                match step {
                    Step::End => {
                        let _: () = redis.con.del(key).unwrap();
                        held[k] = None;
                    }
                    Step::Hit(amount) => {
                        let o = window::hit(held[k], now, 60_000, amount).unwrap();
                        let answer = redis
                            .run(ratestore::redis::scripts::WINDOW, &[key.as_bytes()], &["60000".into(), amount.to_string()])
                            .unwrap();
                        prop_assert!(same_answer(&vec![o.count, o.reset_ms as i64], &answer));
                        held[k] = apply_counter(held[k], o.change);
                    }
                    Step::Op(op) => {
                        let (rust, _) = in_rust(held[k], now, op);
                        let answer = in_redis(redis, key, op).unwrap();
                        prop_assert!(same_answer(&rust, &answer), "{:?}: Rust {:?}, Lua {:?}", op, rust, answer);
                        held[k] = match op {
                            Op::Consume { window_ms, limit, cost } => {
                                apply_counter(held[k], window::consume(held[k], now, window_ms, limit, cost).change)
                            }
                            Op::Refund(amount) => apply_counter(held[k], window::refund(held[k], now, amount).change),
                            Op::RefundTo(..) => apply_counter(held[k], in_rust_change(held[k], now, op)),
                        };
                    }
                }
                let kept = held[k].and_then(|c| c.reset_ms(now).map(|left| (c.count, left)));
                prop_assert!(same_kept(kept, kept_in_redis(redis, key)));
            }
            Ok(())
        })?;
    }
}

fn apply_counter(held: Option<Counter>, change: Change) -> Option<Counter> {
    match change {
        Change::Put(c) => Some(c),
        Change::Keep => held,
        Change::Drop => None,
    }
}

fn in_rust_change(held: Option<Counter>, now: u64, op: Op) -> Change {
    match op {
        Op::RefundTo(amount, own) => {
            let id = held.map_or(1, |c| c.window() + u64::from(!own));
            window::refund_to(held, now, amount, Some(id)).change
        }
        _ => unreachable!("only a named refund"),
    }
}
