//! Several takes as one step on Redis: one script over every take's key
//! ([`script`]), built from the algorithms' own scripts (each body becomes a
//! local function whose parameters are named `KEYS` and `ARGV`, so each
//! algorithm stays written once). Each take runs in turn after its key is
//! snapshotted (`DUMP` and `PEXPIRETIME`); once every take has run, if one
//! refused (or raised an error), every snapshotted key is put back as it was,
//! in reverse order (`DEL` where it did not exist, else `RESTORE … REPLACE
//! ABSTTL`): no other client ever sees the state between. The step travels
//! as one op ([`Op::Takes`](crate::ops::Op::Takes)) whose key is a blob
//! ([`push`], [`takes`]) holding each take's op, numbers and key.

use std::sync::OnceLock;

use super::scripts::{self, Script};
use crate::errors::{Error, Result};
use crate::ops::{Answer, Args, Op, ANSWER_LEN};

/// Numbers in a take's part of the blob before its key: op, 4 numbers, key length.
const HEAD: usize = 1 + 4 * 8 + 4;

/// Adds one take (its key already prefixed; the op's suffix is added here) to `blob`.
pub fn push(blob: &mut Vec<u8>, op: Op, args: &Args, key: impl FnOnce(&mut Vec<u8>)) {
    let at = blob.len();
    blob.push(op.code());
    for a in args {
        blob.extend_from_slice(&a.to_le_bytes());
    }
    blob.extend_from_slice(&[0; 4]);
    let start = blob.len();
    key(blob);
    blob.extend_from_slice(op.suffix(args));
    let len = (blob.len() - start) as u32;
    blob[at + HEAD - 4..at + HEAD].copy_from_slice(&len.to_le_bytes());
}

/// The takes a blob holds, in order: each op, its numbers and its key.
pub fn takes(blob: &[u8]) -> impl Iterator<Item = (Op, Args, &[u8])> {
    let mut rest = blob;
    std::iter::from_fn(move || {
        if rest.len() < HEAD {
            return None;
        }
        // Only takes are pushed: a consume, a sliding consume or a bucket.
        let op = Op::from_code(f64::from(rest[0]))
            .filter(|op| op.is_take())
            .unwrap_or(Op::Bucket);
        let mut args = [0i64; 4];
        for (i, a) in args.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rest[1 + 8 * i..9 + 8 * i]);
            *a = i64::from_le_bytes(b);
        }
        let mut l = [0u8; 4];
        l.copy_from_slice(&rest[HEAD - 4..HEAD]);
        let len = (u32::from_le_bytes(l) as usize).min(rest.len() - HEAD);
        let key = &rest[HEAD..HEAD + len];
        rest = &rest[HEAD + len..];
        Some((op, args, key))
    })
}

/// The keys of a step's blob.
pub fn keys(blob: &[u8]) -> impl Iterator<Item = &[u8]> {
    takes(blob).map(|(_, _, key)| key)
}

/// Calls `f` with the step's `numkeys`, keys and ARGV (five per take: its
/// op's code, then its script's ARGV, padded to four).
pub fn command<R>(blob: &[u8], f: impl FnOnce(&[u8], &[&[u8]], &[&[u8]]) -> R) -> R {
    let all: Vec<(Op, Args, &[u8])> = takes(blob).collect();
    let mut argv: Vec<Vec<u8>> = Vec::with_capacity(5 * all.len());
    for (op, args, _) in &all {
        argv.push(vec![b'0' + op.code()]);
        op.argv(args, |a| {
            for part in a.iter().take(4) {
                argv.push(part.to_vec());
            }
            for _ in a.len()..4 {
                argv.push(b"0".to_vec());
            }
        });
    }
    let keys: Vec<&[u8]> = all.iter().map(|(_, _, k)| *k).collect();
    let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
    let n = keys.len().to_string();
    f(n.as_bytes(), &keys, &argv)
}

/// The step's answers from its script's integers: [`ANSWER_LEN`] per take,
/// each checked as its op's own answer.
pub fn answers(blob: &[u8], values: &[i64]) -> Result<Vec<Answer>> {
    let ops: Vec<Op> = takes(blob).map(|(op, _, _)| op).collect();
    if values.len() != ANSWER_LEN * ops.len() || ops.is_empty() {
        return Err(Error::Redis(
            "a script gave an answer of the wrong shape".into(),
        ));
    }
    ops.iter()
        .zip(values.chunks(ANSWER_LEN))
        .map(|(op, v)| op.answer(&v[..op.answer_len()]))
        .collect()
}

const TAKES_HEAD: &str = r#"
local function snapshot(key)
  local at = redis.call('PEXPIRETIME', key)
  if at == -2 then
    return { key }
  end
  return { key, redis.call('DUMP', key), at }
end

local function restore(kept)
  for i = #kept, 1, -1 do
    local s = kept[i]
    if s[2] == nil then
      redis.call('DEL', s[1])
    else
      redis.call('RESTORE', s[1], s[3] > 0 and s[3] or 0, s[2], 'REPLACE', 'ABSTTL')
    end
  end
end
"#;

const TAKES_BODY: &str = r#"
local ops = { ['1'] = consume, ['5'] = sliding, ['6'] = bucket }
local kept, out, allowed, failed = {}, {}, true, nil
for i = 1, #KEYS do
  local at = 5 * (i - 1)
  kept[#kept + 1] = snapshot(KEYS[i])
  local ok, r = pcall(ops[ARGV[at + 1]], { KEYS[i] }, { ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5] })
  if not ok then
    failed = r
    break
  end
  if type(r) == 'table' and r.err then
    failed = r
    break
  end
  if r[1] ~= 1 then
    allowed = false
  end
  for j = 1, 6 do
    out[#out + 1] = r[j] or 0
  end
end
if failed ~= nil or not allowed then
  restore(kept)
end
if failed ~= nil then
  if type(failed) == 'table' then
    return redis.error_reply(failed.err)
  end
  return redis.error_reply(tostring(failed))
end
return out
"#;

/// One algorithm's script as a local function of `KEYS` and `ARGV`.
fn function(name: &str, body: &str) -> String {
    format!("local function {name}(KEYS, ARGV)\n{body}\nend\n")
}

/// The step's script.
pub fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let body = [
            TAKES_HEAD.to_string(),
            function("consume", scripts::WINDOW_CONSUME),
            function("sliding", scripts::SLIDING),
            function("bucket", scripts::BUCKET),
            TAKES_BODY.to_string(),
        ]
        .concat();
        Script::new(Box::leak(body.into_boxed_str()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_holds_each_take_in_order() {
        let mut blob = Vec::new();
        push(&mut blob, Op::Consume, &[1_000, 7, 1, 0], |b| {
            b.extend_from_slice(b"p:k:burst")
        });
        push(&mut blob, Op::Bucket, &[5, 1, 100, 2], |b| {
            b.extend_from_slice(b"p:k:b")
        });
        let all: Vec<_> = takes(&blob).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], (Op::Consume, [1_000, 7, 1, 0], &b"p:k:burst"[..]));
        assert_eq!(all[1].0, Op::Bucket);
        assert_eq!(
            all[1].2,
            [b"p:k:b".as_slice(), scripts::BUCKET_SUFFIX].concat()
        );
        command(&blob, |n, keys, argv| {
            assert_eq!(n, b"2");
            assert_eq!(keys.len(), 2);
            assert_eq!(argv.len(), 10);
            assert_eq!(argv[..5], [b"1".as_slice(), b"1000", b"7", b"1", b"0"]);
        });
        let answer = answers(&blob, &[1, 1, 6, 1000, 9, 0, 1, 3, 0, 10, 0, 0]).unwrap();
        assert_eq!(answer[0].len, 5);
        assert_eq!(answer[1].values[..4], [1, 3, 0, 10]);
        assert!(answers(&blob, &[1, 2]).is_err());
    }
}
