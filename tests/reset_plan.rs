//! The command plans of `reset.rs` run on a real redis-server: reset(key)
//! removes the state every algorithm keeps for the key and nothing else;
//! resetAll removes every key under the prefix, and none outside it, even
//! when the prefix holds glob characters.

mod scripts;
mod support;

use ratestore::redis::reset::{self, Command, ResetAll};
use redis::Commands;
use scripts::Redis;

fn send(redis: &mut Redis, command: &Command) -> redis::Value {
    let mut cmd = redis::cmd(std::str::from_utf8(&command[0]).unwrap());
    for arg in &command[1..] {
        cmd.arg(arg.as_slice());
    }
    cmd.query(&mut redis.con).unwrap()
}

/// Every algorithm's state for `key`, made by its own script.
fn touch_every_algorithm(redis: &mut Redis, prefix: &[u8], key: &[u8]) {
    let [fixed, sliding_key, bucket_key] = reset::keys_of(prefix, key);
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    redis
        .run(
            ratestore::redis::scripts::WINDOW,
            &[&fixed],
            &args(&["60000", "1"]),
        )
        .unwrap();
    redis
        .run(
            ratestore::redis::scripts::WINDOW_CONSUME,
            &[&fixed],
            &args(&["60000", "5", "1"]),
        )
        .unwrap();
    redis
        .run(
            ratestore::redis::scripts::SLIDING,
            &[&sliding_key],
            &args(&["increment", "60000", "1"]),
        )
        .unwrap();
    redis
        .run(
            ratestore::redis::scripts::BUCKET,
            &[&bucket_key],
            &args(&["5", "1", "1000", "1"]),
        )
        .unwrap();
}

fn exists(redis: &mut Redis, key: &[u8]) -> bool {
    redis.con.exists(key).unwrap()
}

#[test]
fn reset_removes_every_algorithm_of_one_key() {
    let mut redis = Redis::connect("reset");
    let prefix = redis.key("app:").into_bytes();
    touch_every_algorithm(&mut redis, &prefix, b"k");
    touch_every_algorithm(&mut redis, &prefix, b"k2");
    for key in reset::keys_of(&prefix, b"k")
        .iter()
        .chain(&reset::keys_of(&prefix, b"k2"))
    {
        assert!(exists(&mut redis, key));
    }
    for command in reset::reset(&prefix, b"k", |_| 0) {
        send(&mut redis, &command);
    }
    for key in reset::keys_of(&prefix, b"k") {
        assert!(!exists(&mut redis, &key));
    }
    for key in reset::keys_of(&prefix, b"k2") {
        assert!(exists(&mut redis, &key));
    }
}

#[test]
fn reset_all_stays_inside_its_prefix() {
    let mut redis = Redis::connect("reset-all");
    // Glob characters: unescaped, `*` and `?` and `[..]` would match keys outside.
    let prefix = redis.key(r"a*b?[cd]\e:").into_bytes();
    let inside: Vec<Vec<u8>> = (0..2_500)
        .map(|i| [&prefix[..], format!("{i}").as_bytes()].concat())
        .collect();
    for chunk in inside.chunks(500) {
        let pairs: Vec<(&[u8], i64)> = chunk.iter().map(|k| (k.as_slice(), 1)).collect();
        let _: () = redis.con.mset(&pairs).unwrap();
    }
    touch_every_algorithm(&mut redis, &prefix, b"k");
    let outside: Vec<Vec<u8>> = [
        r"aXbY[cd]\e:1",
        r"a*b?c\e:1",
        r"a*b?d\e:2",
        r"a*b?[cd]e:3",
        r"a*b?[cd]\e",
    ]
    .iter()
    .map(|s| redis.key(s).into_bytes())
    .chain([b"other:1".to_vec(), prefix[..prefix.len() - 1].to_vec()])
    .collect();
    for key in &outside {
        let _: () = redis.con.set(key.as_slice(), 1).unwrap();
    }

    let mut all = ResetAll::new(&prefix).unwrap();
    let mut unlinked = 0;
    while let Some(scan) = all.next_scan() {
        let (cursor, keys): (Vec<u8>, Vec<Vec<u8>>) =
            redis::from_redis_value(send(&mut redis, &scan)).unwrap();
        for command in all.on_scan_reply(cursor, keys, |_| 0) {
            assert!(command.len() - 1 <= reset::BATCH);
            unlinked += command.len() - 1;
            send(&mut redis, &command);
        }
    }
    assert!(unlinked >= inside.len() + 3);
    let pattern = reset::match_pattern(&prefix);
    let left: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut redis.con)
        .unwrap();
    assert!(left.is_empty(), "{} keys left under the prefix", left.len());
    for key in &outside {
        assert!(
            exists(&mut redis, key),
            "{} was removed",
            String::from_utf8_lossy(key)
        );
    }
    for key in &outside {
        let _: () = redis.con.del(key.as_slice()).unwrap();
    }
}

#[test]
fn reset_all_refuses_an_empty_prefix() {
    assert_eq!(ResetAll::new(b"").unwrap_err().code(), "ERR_CONFIG");
}
