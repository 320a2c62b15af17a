//! How Redis runs each op: its Lua script (sent as EVALSHA, or EVAL on
//! first use), the suffix of the key it works on, and its ARGV. The scripts
//! are the twins of the Rust algorithms (`window`, `sliding`, `bucket`),
//! which `tests/*_twin.rs` run side by side against a real redis-server.

use std::sync::OnceLock;

use super::resp::digits;
use crate::ops::{Args, Op};

/// The fixed window's hit (`window.lua`), which keeps time through PTTL;
/// `tests/window_twin.rs` runs the same cases through it and `window`.
pub const WINDOW: &str = include_str!("lua/window.lua");
/// The fixed window's limit-aware consume (`window_consume.lua`).
pub const WINDOW_CONSUME: &str = include_str!("lua/window_consume.lua");
/// The fixed window's refund (`window_refund.lua`).
pub const WINDOW_REFUND: &str = include_str!("lua/window_refund.lua");
/// The sliding window (`sliding.lua`), on the server's TIME; `ARGV[1]`
/// names the operation.
pub const SLIDING: &str = include_str!("lua/sliding.lua");
/// The token bucket (`bucket.lua`), on the server's TIME.
pub const BUCKET: &str = include_str!("lua/bucket.lua");

/// Appended to `prefix + key` for the hash holding a sliding window.
pub const SLIDING_SUFFIX: &[u8] = b":sw";
/// Appended to `prefix + key` for the hash holding a token bucket.
pub const BUCKET_SUFFIX: &[u8] = b":tb";

/// A Lua script and its SHA1, for EVALSHA.
pub struct Script {
    pub body: &'static str,
    sha: OnceLock<String>,
}

impl Script {
    pub const fn new(body: &'static str) -> Script {
        Script {
            body,
            sha: OnceLock::new(),
        }
    }

    pub fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| sha1_smol::Sha1::from(self.body).digest().to_string())
    }
}

static HIT_SCRIPT: Script = Script::new(WINDOW);
static CONSUME_SCRIPT: Script = Script::new(WINDOW_CONSUME);
static REFUND_SCRIPT: Script = Script::new(WINDOW_REFUND);
static SLIDING_SCRIPT: Script = Script::new(SLIDING);
static BUCKET_SCRIPT: Script = Script::new(BUCKET);

/// Where a key's state of each algorithm lives: `prefix + key + suffix`.
pub const SUFFIXES: [&[u8]; 3] = [b"", SLIDING_SUFFIX, BUCKET_SUFFIX];

impl Op {
    /// The script the op runs on Redis (None: a plain command).
    pub fn script(self) -> Option<&'static Script> {
        match self {
            Op::Hit => Some(&HIT_SCRIPT),
            Op::Consume => Some(&CONSUME_SCRIPT),
            Op::Refund => Some(&REFUND_SCRIPT),
            Op::SlidingIncrement | Op::SlidingDecrement | Op::SlidingConsume => {
                Some(&SLIDING_SCRIPT)
            }
            Op::Bucket => Some(&BUCKET_SCRIPT),
            Op::Takes => Some(super::step::script()),
            Op::Unlink | Op::Ping => None,
        }
    }

    /// The suffix of the key the op works on.
    pub fn suffix(self, args: &Args) -> &'static [u8] {
        match self {
            Op::Hit | Op::Consume | Op::Refund => SUFFIXES[0],
            Op::SlidingIncrement | Op::SlidingDecrement | Op::SlidingConsume => SUFFIXES[1],
            Op::Bucket => SUFFIXES[2],
            Op::Unlink => SUFFIXES[args[0] as usize],
            Op::Ping | Op::Takes => SUFFIXES[0],
        }
    }

    /// Calls `f` with the script's ARGV (after `KEYS[1]`), as bytes.
    pub fn argv<R>(self, args: &Args, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let mut bufs = [[0u8; 20]; 4];
        let [b0, b1, b2, b3] = &mut bufs;
        let [a0, a1, a2, a3] = *args;
        match self {
            Op::Hit => f(&[digits(a0, b0), digits(a1, b1)]),
            Op::Consume => f(&[digits(a0, b0), digits(a1, b1), digits(a2, b2)]),
            Op::Refund => f(&[digits(a0, b0), digits(a1, b1)]),
            Op::SlidingIncrement => f(&[b"increment", digits(a0, b0), digits(a1, b1)]),
            // The window named sits where a consume's limit does.
            Op::SlidingDecrement => {
                f(&[b"decrement", digits(a0, b0), digits(a1, b1), digits(a2, b2)])
            }
            // The script takes the cost before the limit.
            Op::SlidingConsume => f(&[b"consume", digits(a0, b0), digits(a2, b2), digits(a1, b1)]),
            Op::Bucket => f(&[
                digits(a0, b0),
                digits(a1, b1),
                digits(a2, b2),
                digits(a3, b3),
            ]),
            Op::Unlink | Op::Ping | Op::Takes => f(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::Op;

    fn argv(op: Op, n: [f64; 4]) -> Vec<Vec<u8>> {
        let args = op.check(n).unwrap();
        op.argv(&args, |a| a.iter().map(|x| x.to_vec()).collect::<Vec<_>>())
    }

    #[test]
    fn sliding_consume_sends_its_cost_before_its_limit() {
        assert_eq!(
            argv(Op::SlidingConsume, [1_000.0, 10.0, 3.0, 0.0]),
            [
                b"consume".to_vec(),
                b"1000".to_vec(),
                b"3".to_vec(),
                b"10".to_vec()
            ]
        );
        assert_eq!(Op::Unlink.suffix(&[1, 0, 0, 0]), b":sw");
    }

    #[test]
    fn a_give_back_sends_the_window_it_names() {
        assert_eq!(
            argv(Op::SlidingDecrement, [100.0, 1.0, 9.0, 0.0])[3],
            b"9".to_vec()
        );
    }
}
