//! ratestore's RESP writer and reader against the `redis` crate's, on what a
//! hit sends and reads: `EVALSHA <sha> 1 <key> 60000 1` out, `*2 :count
//! :resetMs` back. Run with `cargo bench --bench resp`; it prints ns per
//! command and per reply, the best of several rounds (README, "The redis
//! crate").

use std::hint::black_box;
use std::io::Cursor;
use std::time::Instant;

use ratestore::redis::resp::{encode_parts, Parser, Value};

const SHA: &[u8] = b"bcac7e880ea13c7d9b93ddd64de39316d32afc34";
const ROUNDS: usize = 7;
const N: usize = 200_000;

/// The best ns per item of `ROUNDS` rounds of `f`, which does `N` items.
fn best(mut f: impl FnMut()) -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_nanos() as f64 / N as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let keys: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("ratelimit:chat:ip:10.0.{}.{}", i >> 8, i & 255).into_bytes())
        .collect();
    let mut out = Vec::with_capacity(N * 96);

    let ours_encode = best(|| {
        out.clear();
        for i in 0..N {
            let key = &keys[i % keys.len()];
            encode_parts(&mut out, &[b"EVALSHA", SHA, b"1", key], &[b"60000", b"1"]);
        }
        black_box(&out);
    });
    let theirs_encode = best(|| {
        out.clear();
        for i in 0..N {
            let key = &keys[i % keys.len()];
            redis::cmd("EVALSHA")
                .arg(SHA)
                .arg(1)
                .arg(key.as_slice())
                .arg(60_000)
                .arg(1)
                .write_packed_command(&mut out);
        }
        black_box(&out);
    });

    let replies: Vec<u8> = (0..N)
        .flat_map(|i| format!("*2\r\n:{}\r\n:{}\r\n", i % 100, 60_000 - i % 60_000).into_bytes())
        .collect();
    let ours_parse = best(|| {
        let mut parser = Parser::default();
        parser.feed(&replies);
        let mut n = 0;
        while let Ok(Some(Value::Array(Some(items)))) = parser.next() {
            n += items.len();
        }
        assert_eq!(n, 2 * N);
    });
    let theirs_parse = best(|| {
        let mut parser = redis::Parser::new();
        let mut reader = Cursor::new(replies.as_slice());
        let mut n = 0;
        // The parser keeps what it read ahead; at the end of the bytes it answers an error.
        while let Ok(redis::Value::Array(items)) = parser.parse_value(&mut reader) {
            n += items.len();
        }
        assert_eq!(n, 2 * N);
    });

    println!("| what a hit costs | ratestore's RESP (ns) | the redis crate's (ns) | redis crate / ratestore |");
    println!("| --- | ---: | ---: | ---: |");
    for (what, ours, theirs) in [
        (
            "write `EVALSHA <sha> 1 <key> 60000 1`",
            ours_encode,
            theirs_encode,
        ),
        ("read `*2 :count :resetMs`", ours_parse, theirs_parse),
    ] {
        println!(
            "| {what} | {ours:.1} | {theirs:.1} | {:.2}x |",
            theirs / ours
        );
    }
}
