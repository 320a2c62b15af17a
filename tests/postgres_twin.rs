//! The PL/pgSQL functions of postgresStore (`src/postgres/schema.rs`) answer
//! as `window.rs`, `sliding.rs` and `bucket.rs`: random sequences of calls run through both
//! at the same explicit times (the functions' last argument), on a real
//! PostgreSQL started here, and every answer and every state kept must match.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

use proptest::prelude::*;
use ratestore::bucket::{self, Bucket};
use ratestore::postgres::schema::{ddl, Names};
use ratestore::sliding::{self, Sliding};
use ratestore::window::{self, Change, Counter, MAX_PERIOD_MS, MAX_SAFE};
use tokio_postgres::{Client, NoTls};

const MS: u64 = 1000;
/// A time in 2026, in µs since the epoch: the times the cases count at start here.
const BASE: u64 = 1_770_000_000_000_000;

/// A throwaway cluster (initdb, trust auth on a free loopback port), stopped when dropped.
struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    root: bool,
}

impl Postgres {
    fn bin() -> PathBuf {
        let root = PathBuf::from("/usr/lib/postgresql");
        let mut versions: Vec<_> = std::fs::read_dir(&root)
            .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
            .unwrap_or_default();
        versions.retain(|p: &PathBuf| p.join("initdb").exists());
        versions.sort();
        versions.pop().unwrap_or_else(|| {
            panic!(
                "PostgreSQL server binaries were not found under /usr/lib/postgresql/*/bin: these tests \
                 run against a real PostgreSQL (apt-get install postgresql)"
            )
        })
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let path = self.bin.join(tool);
        let mut command = if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let out = command
            .args(args)
            .output()
            .expect("the PostgreSQL tool runs");
        assert!(
            out.status.success(),
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start() -> Postgres {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let dir = std::env::temp_dir().join(format!("ratestore-pg-twin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if root {
            let ok = Command::new("chown")
                .arg("postgres")
                .arg(&dir)
                .status()
                .unwrap();
            assert!(ok.success());
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let pg = Postgres {
            dir,
            bin: Postgres::bin(),
            port,
            root,
        };
        let data = pg.dir.join("data");
        let data = data.to_str().unwrap();
        pg.run(
            "initdb",
            &["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        );
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            pg.dir.display()
        );
        let log = pg.dir.join("log");
        pg.run(
            "pg_ctl",
            &[
                "start",
                "-D",
                data,
                "-w",
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
            ],
        );
        pg
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        self.run(
            "pg_ctl",
            &["stop", "-D", data.to_str().unwrap(), "-m", "immediate"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Db {
    _server: Postgres,
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl Db {
    fn open() -> Db {
        let server = Postgres::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port);
        let client = runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
            tokio::spawn(connection);
            client
                .batch_execute(&ddl(&Names::new("twin", None).unwrap()))
                .await
                .unwrap();
            client
        });
        Db {
            _server: server,
            runtime,
            client,
        }
    }

    /// One statement's first value: an int8[] answer, or the error's SQLSTATE.
    fn call(&self, sql: &str) -> Result<Vec<i64>, String> {
        self.runtime.block_on(async {
            match self.client.simple_query(sql).await {
                Ok(messages) => {
                    for m in messages {
                        if let tokio_postgres::SimpleQueryMessage::Row(row) = m {
                            let text = row
                                .get(0)
                                .unwrap_or("")
                                .trim_matches(|c| c == '{' || c == '}');
                            return Ok(text.split(',').map(|n| n.parse().unwrap()).collect());
                        }
                    }
                    Ok(Vec::new())
                }
                Err(e) => Err(e
                    .as_db_error()
                    .map_or("?".into(), |d| d.code().code().to_string())),
            }
        })
    }

    fn exec(&self, sql: &str) {
        self.runtime
            .block_on(self.client.batch_execute(sql))
            .unwrap();
    }
}

/// What Redis and memoryStore keep: a state past its end is gone.
fn live<S>(stored: Option<S>, ends: impl Fn(&S) -> u64, now: u64) -> Option<S> {
    stored.filter(|s| now < ends(s))
}

#[derive(Clone, Copy, Debug)]
enum SlidingOp {
    Increment(i64),
    /// An amount, and which window it names: 0 none, 1 the current one, 2 the previous one, 3 another.
    Decrement(i64, u8),
    Consume {
        limit: i64,
        cost: i64,
    },
}

fn sliding_case(db: &Db, seq: &[(u64, u64, SlidingOp)], key: &str) -> Result<(), TestCaseError> {
    db.exec(&format!("DELETE FROM twin_sw WHERE key = '{key}'"));
    let mut stored: Option<Sliding> = None;
    let mut now = BASE;
    for &(step, window_ms, op) in seq {
        now += step;
        let held = live(stored, |s| s.ends_at, now);
        let window = window_ms * MS;
        let end = now - now % window + window;
        let (code, amount, arg, rust) = match op {
            SlidingOp::Increment(a) => {
                let r = sliding::increment(held, now, window_ms, a)
                    .map(|o| (vec![o.count, o.reset_ms as i64, o.window as i64], o.change));
                (0, a, 0, r.map_err(|_| "RS001".to_string()))
            }
            SlidingOp::Decrement(a, which) => {
                let named = match which {
                    0 => 0,
                    1 => end,
                    2 => end - window,
                    _ => end + window,
                };
                let o = sliding::decrement(held, now, window_ms, a, (named > 0).then_some(named));
                (
                    1,
                    a,
                    named as i64,
                    Ok((vec![o.count, o.reset_ms as i64, o.window as i64], o.change)),
                )
            }
            SlidingOp::Consume { limit, cost } => {
                let o = sliding::consume(held, now, window_ms, limit, cost);
                let answer = vec![
                    o.allowed as i64,
                    o.count,
                    o.remaining,
                    o.reset_ms as i64,
                    o.retry_ms as i64,
                    o.window as i64,
                ];
                (2, cost, limit, Ok((answer, o.change)))
            }
        };
        let pg = db.call(&format!(
            "SELECT twin_sw_v1({code}, '{key}', {window_ms}, {amount}, {arg}, {now})"
        ));
        let rust_answer = rust.clone().map(|(a, _)| a);
        prop_assert_eq!(&pg, &rust_answer, "{:?} at {} on {:?}", op, now, held);
        if let Ok((_, change)) = rust {
            stored = match change {
                Change::Put(s) => Some(s),
                Change::Keep => held,
                Change::Drop => None,
            };
        }
        // The row kept, while it counts, is Rust's state.
        let row = db.call(&format!(
            "SELECT ARRAY[start_us, previous, current, (extract(epoch FROM expires_at) * 1000000)::int8] \
             FROM twin_sw WHERE key = '{key}' AND expires_at > 'epoch'::timestamptz + interval '1 microsecond' * {now}"
        )).unwrap();
        let kept = live(stored, |s| s.ends_at, now)
            .map(|s| vec![s.start as i64, s.previous, s.current, s.ends_at as i64])
            .unwrap_or_default();
        prop_assert_eq!(row, kept, "kept after {:?} at {}", op, now);
    }
    Ok(())
}

fn sliding_op() -> impl Strategy<Value = SlidingOp> {
    let amount = prop_oneof![8 => 0i64..6, 1 => Just(MAX_SAFE / 3), 1 => (MAX_SAFE - 8)..=MAX_SAFE];
    prop_oneof![
        amount.clone().prop_map(SlidingOp::Increment),
        (0i64..6, 0u8..4).prop_map(|(a, w)| SlidingOp::Decrement(a, w)),
        (prop_oneof![0i64..8, Just(MAX_SAFE)], amount)
            .prop_map(|(limit, cost)| SlidingOp::Consume { limit, cost }),
    ]
}

/// µs from one call to the next: often within a ms or two (the edges of ms ticks), else up to 3 s.
fn step() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..2_500, 2 => 0u64..3_000_000]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Both twins on one server, which this test starts and stops.
#[test]
fn the_functions_answer_as_the_rust_rules() {
    let db = Db::open();
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let sliding = (
        prop_oneof![1u64..50, 1_000u64..2_000, Just(MAX_PERIOD_MS)],
        proptest::collection::vec((step(), sliding_op()), 1..30),
        0u8..3,
    );
    runner
        .run(&sliding, |(window_ms, seq, key)| {
            let seq: Vec<_> = seq
                .into_iter()
                .map(|(step, op)| (step, window_ms, op))
                .collect();
            sliding_case(&db, &seq, &format!("k{key}"))
        })
        .unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let fixed = (
        prop_oneof![1u64..50, 1_000u64..2_000, Just(1u64 << 40)],
        proptest::collection::vec((step(), fixed_op()), 1..30),
    );
    runner
        .run(&fixed, |(window_ms, seq)| fixed_case(&db, window_ms, &seq))
        .unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let buckets = (
        prop_oneof![1i64..12, Just(MAX_SAFE)],
        prop_oneof![1i64..5, Just(MAX_SAFE / 2)],
        prop_oneof![1u64..50, 1_000u64..5_000],
        proptest::collection::vec((step(), prop_oneof![0i64..14, Just(MAX_SAFE)]), 1..30),
    );
    runner
        .run(&buckets, |(capacity, refill, interval_ms, seq)| {
            bucket_case(&db, capacity, refill, interval_ms, &seq)
        })
        .unwrap();
}

fn bucket_case(
    db: &Db,
    capacity: i64,
    refill: i64,
    interval_ms: u64,
    seq: &[(u64, i64)],
) -> Result<(), TestCaseError> {
    let Ok((p, _)) = bucket::check(capacity as f64, refill as f64, interval_ms as f64, 0.0) else {
        // Out of range (too slow to fill): the JS face refuses it before any store.
        return Ok(());
    };
    db.exec("DELETE FROM twin_tb");
    let mut stored: Option<Bucket> = None;
    let mut now = BASE;
    for &(step, cost) in seq {
        now += step;
        let held = live(stored, |b| b.ends_at, now);
        let o = bucket::take(held, now, &p, cost);
        let rust = vec![
            o.allowed as i64,
            o.remaining,
            o.retry_ms as i64,
            o.reset_ms as i64,
        ];
        let pg = db.call(&format!(
            "SELECT twin_tb_v1('k', {capacity}, {refill}, {interval_ms}, {cost}, {now})"
        ));
        prop_assert_eq!(pg, Ok(rust), "cost {} at {} on {:?}", cost, now, held);
        stored = match o.change {
            Change::Put(b) => Some(b),
            Change::Keep => held,
            Change::Drop => None,
        };
        let row = db
            .call(&format!(
                "SELECT ARRAY[tokens, at_us, (extract(epoch FROM expires_at) * 1000000)::int8] FROM twin_tb \
                 WHERE key = 'k' AND expires_at > 'epoch'::timestamptz + interval '1 microsecond' * {now}"
            ))
            .unwrap();
        let kept = live(stored, |b| b.ends_at, now)
            .map(|b| vec![b.tokens, b.refilled_at as i64, b.ends_at as i64])
            .unwrap_or_default();
        prop_assert_eq!(row, kept, "kept after cost {} at {}", cost, now);
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum FixedOp {
    Hit(i64),
    Consume {
        limit: i64,
        cost: i64,
    },
    /// An amount, and which window it names: 0 none, 1 the open one, 2 another.
    Refund(i64, u8),
}

fn fixed_op() -> impl Strategy<Value = FixedOp> {
    let amount = prop_oneof![8 => -4i64..6, 1 => Just(MAX_SAFE), 1 => Just(-MAX_SAFE), 1 => Just(MAX_SAFE / 2)];
    prop_oneof![
        amount.prop_map(FixedOp::Hit),
        (
            prop_oneof![0i64..8, Just(MAX_SAFE)],
            prop_oneof![0i64..10, Just(MAX_SAFE)]
        )
            .prop_map(|(limit, cost)| FixedOp::Consume { limit, cost }),
        (0i64..6, 0u8..3).prop_map(|(a, w)| FixedOp::Refund(a, w)),
    ]
}

/// The fixed window on seed 000's table: every answer, and the row while its window is open.
fn fixed_case(db: &Db, window_ms: u64, seq: &[(u64, FixedOp)]) -> Result<(), TestCaseError> {
    db.exec("DELETE FROM twin");
    let mut stored: Option<Counter> = None;
    let mut now = BASE;
    for &(step, op) in seq {
        now += step;
        let open = stored.filter(|c| c.reset_ms(now).is_some());
        let (code, amount, arg, rust) = match op {
            FixedOp::Hit(a) => {
                let r = window::hit(stored, now, window_ms, a)
                    .map(|o| (vec![o.count, o.reset_ms as i64], o.change))
                    .map_err(|_| "RS001".to_string());
                (0, a, 0, r)
            }
            FixedOp::Consume { limit, cost } => {
                let o = window::consume(stored, now, window_ms, limit, cost);
                let answer = vec![
                    o.allowed as i64,
                    o.count,
                    o.remaining,
                    o.reset_ms as i64,
                    o.window as i64,
                ];
                (1, cost, limit, Ok((answer, o.change)))
            }
            FixedOp::Refund(a, which) => {
                let named = match (which, open) {
                    (1, Some(c)) => c.window(),
                    (2, _) => 7,
                    _ => 0,
                };
                let o = window::refund_to(stored, now, a, (named > 0).then_some(named));
                (
                    2,
                    a,
                    named as i64,
                    Ok((vec![o.count, o.reset_ms as i64], o.change)),
                )
            }
        };
        let pg = db.call(&format!(
            "SELECT twin_fw_v1({code}, 'k', {window_ms}, {amount}, {arg}, {now})"
        ));
        let rust_answer = rust.clone().map(|(a, _)| a);
        prop_assert_eq!(&pg, &rust_answer, "{:?} at {} on {:?}", op, now, stored);
        if let Ok((_, change)) = rust {
            stored = match change {
                Change::Put(c) => Some(c),
                Change::Keep => stored,
                Change::Drop => None,
            };
        }
        let row = db
            .call(&format!(
                "SELECT ARRAY[total, (extract(epoch FROM reset_at) * 1000000)::int8] FROM twin WHERE key = 'k' \
                 AND floor(extract(epoch FROM reset_at) * 1000) > floor({now}::numeric / 1000)"
            ))
            .unwrap();
        let kept = stored
            .filter(|c| c.reset_ms(now).is_some())
            .map(|c| vec![c.count, c.ends_at as i64])
            .unwrap_or_default();
        prop_assert_eq!(row, kept, "kept after {:?} at {}", op, now);
    }
    Ok(())
}
