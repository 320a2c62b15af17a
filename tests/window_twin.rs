//! `window.rs` and its Lua twin `window.lua` answer the same table of cases:
//! each case runs through `window::hit` and through the script on a real
//! redis-server (by way of the store that sends it), and the answers and
//! what each keeps afterwards are compared.

mod support;

use std::time::Duration;

use ratestore::errors::Error;
use ratestore::ops::Op;
use ratestore::redis::{Config, Options, Query, Store};
use ratestore::window::{self, Change, Counter, MAX_SAFE};
use redis::Commands;

const MS: u64 = 1000;
/// The Rust side's clock for every case, in µs.
const NOW: u64 = 1_000_000 * MS;

/// What the key holds before the hit.
#[derive(Clone, Copy, Debug)]
enum Stored {
    Nothing,
    /// A window with this many ms left.
    Open(i64, u64),
    /// A counter without a TTL (a hit of the reference store cut short).
    NoTtl(i64),
    /// A window with under 1 ms left.
    Ending(i64),
}

struct Case {
    name: &'static str,
    stored: Stored,
    window_ms: u64,
    amount: i64,
}

const fn case(name: &'static str, stored: Stored, window_ms: u64, amount: i64) -> Case {
    Case {
        name,
        stored,
        window_ms,
        amount,
    }
}

const MONTH: u64 = 30 * 24 * 3_600_000;

const CASES: &[Case] = &[
    case("a new key opens a window", Stored::Nothing, 60_000, 1),
    case("a read of a new key opens none", Stored::Nothing, 60_000, 0),
    case("a refund on a new key", Stored::Nothing, 60_000, -3),
    case("adds within a window", Stored::Open(5, 30_000), 60_000, 2),
    case("reads within a window", Stored::Open(5, 30_000), 60_000, 0),
    case("refunds below zero", Stored::Open(5, 30_000), 60_000, -9),
    case("keeps the window's end", Stored::Open(5, 30_000), 1_000, 1),
    case(
        "restarts a counter with no TTL",
        Stored::NoTtl(7),
        10_000,
        2,
    ),
    case(
        "reads 0 from a counter with no TTL",
        Stored::NoTtl(7),
        10_000,
        0,
    ),
    case("under 1 ms left is ended", Stored::Ending(9), 5_000, 4),
    case("a read of an ending window", Stored::Ending(9), 5_000, 0),
    case(
        "reaches the top of the range",
        Stored::Open(MAX_SAFE - 1, 60_000),
        60_000,
        1,
    ),
    case(
        "refuses past the top",
        Stored::Open(MAX_SAFE, 60_000),
        60_000,
        1,
    ),
    case(
        "refuses past the bottom",
        Stored::Open(-MAX_SAFE, 60_000),
        60_000,
        -1,
    ),
    case(
        "spans the whole range",
        Stored::Open(-MAX_SAFE, 60_000),
        60_000,
        MAX_SAFE,
    ),
    case(
        "opens at the top of the range",
        Stored::Nothing,
        60_000,
        MAX_SAFE,
    ),
    case("a 30-day window", Stored::Nothing, MONTH, 1),
    case("a 1 ms window", Stored::Nothing, 1, 1),
];

/// What the key holds after the hit: the count and ms left, if anything.
type Kept = Option<(i64, u64)>;

fn in_rust(c: &Case) -> (Result<(i64, u64), Error>, Kept) {
    let stored = match c.stored {
        Stored::Nothing => None,
        Stored::Open(count, left) => Some((count, NOW + left * MS)),
        // Ended windows: the rules treat a counter with no TTL the same way.
        Stored::NoTtl(count) => Some((count, NOW - MS)),
        Stored::Ending(count) => Some((count, NOW + MS / 2)),
    }
    .map(|(count, ends_at)| Counter {
        count,
        ends_at,
        long: false,
    });
    let left = |c: Counter| (c.ends_at - NOW).div_ceil(MS);
    match window::hit(stored, NOW, c.window_ms, c.amount) {
        Err(e) => (Err(e), stored.map(|s| (s.count, left(s)))),
        Ok(o) => {
            let kept = match o.change {
                Change::Put(counter) => Some((counter.count, left(counter))),
                Change::Keep => stored.map(|s| (s.count, left(s))),
                Change::Drop => None,
            };
            (Ok((o.count, o.reset_ms)), kept)
        }
    }
}

fn in_redis(
    c: &Case,
    store: &Store,
    rt: &tokio::runtime::Runtime,
    con: &mut redis::Connection,
    key: &str,
) -> (Result<(i64, u64), Error>, Kept) {
    let _: () = con.del(key).unwrap();
    match c.stored {
        Stored::Nothing => {}
        Stored::Open(count, left) => con.pset_ex(key, count, left).unwrap(),
        Stored::NoTtl(count) => con.set(key, count).unwrap(),
        Stored::Ending(count) => {
            con.pset_ex::<_, _, ()>(key, count, 1).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    let result = rt
        .block_on(store.hit(Query {
            key: key.as_bytes(),
            op: Op::Hit,
            args: [c.window_ms as i64, c.amount, 0, 0],
        }))
        .map(|(answer, _)| (answer.values[0], answer.values[1] as u64));
    let count: Option<i64> = con.get(key).unwrap();
    let pttl: i64 = con.pttl(key).unwrap();
    // A counter with no TTL that nothing touched reads as ended, as the rules see it.
    let kept = count.filter(|_| pttl > 0).map(|n| (n, pttl as u64));
    (result, kept)
}

/// Redis's clock runs on between the set-up, the hit and the read-back.
const SLACK_MS: u64 = 20;

/// Rust's time is read before each call to Redis, so either side may have
/// the more left: Redis by as much as its call that opened the window ran
/// later after Rust's reading than this one did.
fn close_ms(rust: u64, redis: u64) -> bool {
    rust.abs_diff(redis) <= SLACK_MS
}

#[test]
fn window_rs_and_window_lua_agree() {
    let server = support::RedisServer::start();
    let options = Options {
        url: Some(server.url()),
        ..Options::default()
    };
    let config = Config::resolve(&options, |_| None).unwrap();
    let store = Store::new(&config).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();

    for (i, c) in CASES.iter().enumerate() {
        let key = format!("twin:{i}");
        let (rust, rust_kept) = in_rust(c);
        let (redis, redis_kept) = in_redis(c, &store, &rt, &mut con, &key);
        match (&rust, &redis) {
            (Ok((rc, rr)), Ok((dc, dr))) => {
                assert_eq!(rc, dc, "{}: count", c.name);
                assert!(close_ms(*rr, *dr), "{}: resetMs {rr} vs {dr}", c.name);
            }
            (Err(re), Err(de)) => assert_eq!(re, de, "{}: error", c.name),
            _ => panic!(
                "{}: window.rs answered {rust:?}, the script {redis:?}",
                c.name
            ),
        }
        match (rust_kept, redis_kept) {
            (Some((rc, rl)), Some((dc, dl))) => {
                assert_eq!(rc, dc, "{}: kept count", c.name);
                assert!(close_ms(rl, dl), "{}: kept ms {rl} vs {dl}", c.name);
            }
            // Both keep nothing open (Redis may hold an ended counter it need not forget),
            // or a window of a few ms ended before it was read back.
            (None, None) => {}
            (Some((_, left)), None) if left <= SLACK_MS => {}
            (rust_kept, redis_kept) => panic!(
                "{}: window.rs keeps {rust_kept:?}, Redis {redis_kept:?}",
                c.name
            ),
        }
    }
}
