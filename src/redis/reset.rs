//! What `reset(key)` and `resetAll()` send to Redis, as lists of commands for
//! a transport to run: the key of each algorithm's state, and `SCAN MATCH
//! <prefix>*` with `UNLINK` in batches (never `KEYS`, which blocks the server).
//!
//! In a cluster a multi-key command must stay within one hash slot, so the
//! keys of every UNLINK are grouped by the slot the caller's function gives
//! (a single server passes one that answers 0), and resetAll runs once per
//! master.

use super::scripts;
use crate::errors::{Error, Result};

/// Keys asked of SCAN at a time, and the most one UNLINK removes.
pub const BATCH: usize = 1000;

/// One command: its name and arguments.
pub type Command = Vec<Vec<u8>>;

/// The Redis keys of `key` under `prefix`: the fixed window's (`prefix + key`,
/// the JS reference store's layout), the sliding window's and the token
/// bucket's.
pub fn keys_of(prefix: &[u8], key: &[u8]) -> [Vec<u8>; 3] {
    scripts::SUFFIXES.map(|suffix| [prefix, key, suffix].concat())
}

/// The UNLINKs of `reset(key)`: every algorithm's state of the key.
pub fn reset(prefix: &[u8], key: &[u8], slot: impl Fn(&[u8]) -> u16) -> Vec<Command> {
    unlink(keys_of(prefix, key).into(), slot)
}

/// UNLINKs of at most [`BATCH`] keys each, one slot per command, keys in the
/// order given within each slot.
fn unlink(keys: Vec<Vec<u8>>, slot: impl Fn(&[u8]) -> u16) -> Vec<Command> {
    let mut by_slot: Vec<(u16, Vec<Vec<u8>>)> = Vec::new();
    for key in keys {
        let s = slot(&key);
        match by_slot.iter_mut().find(|(k, _)| *k == s) {
            Some((_, group)) => group.push(key),
            None => by_slot.push((s, vec![key])),
        }
    }
    by_slot
        .into_iter()
        .flat_map(|(_, group)| {
            group
                .chunks(BATCH)
                .map(|chunk| {
                    let mut command = vec![b"UNLINK".to_vec()];
                    command.extend(chunk.iter().cloned());
                    command
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The glob pattern that matches exactly the keys starting with `prefix`:
/// its `*?[]\` escaped, then `*`.
pub fn match_pattern(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 1);
    for &byte in prefix {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.push(b'*');
    pattern
}

/// `resetAll()` on one server (or one cluster master): SCAN until the cursor
/// comes back to 0, unlinking what each page found.
#[derive(Debug)]
pub struct ResetAll {
    prefix: Vec<u8>,
    pattern: Vec<u8>,
    /// The next SCAN's cursor; `None` once the scan is complete.
    cursor: Option<Vec<u8>>,
}

impl ResetAll {
    /// Refuses an empty prefix: it would empty the whole database.
    pub fn new(prefix: &[u8]) -> Result<ResetAll> {
        if prefix.is_empty() {
            return Err(Error::Config(
                "resetAll() is refused with an empty prefix, since it would empty the whole database; \
                 give the store a prefix"
                    .into(),
            ));
        }
        Ok(ResetAll {
            prefix: prefix.to_vec(),
            pattern: match_pattern(prefix),
            cursor: Some(b"0".to_vec()),
        })
    }

    /// The next SCAN to send, or `None` when every key has been seen.
    pub fn next_scan(&self) -> Option<Command> {
        let cursor = self.cursor.as_ref()?;
        Some(vec![
            b"SCAN".to_vec(),
            cursor.clone(),
            b"MATCH".to_vec(),
            self.pattern.clone(),
            b"COUNT".to_vec(),
            BATCH.to_string().into_bytes(),
        ])
    }

    /// Takes a SCAN reply (the next cursor and the keys of the page) and
    /// answers the UNLINKs to send for it. A key outside the prefix is never
    /// unlinked, whatever the server answered.
    pub fn on_scan_reply(
        &mut self,
        cursor: Vec<u8>,
        keys: Vec<Vec<u8>>,
        slot: impl Fn(&[u8]) -> u16,
    ) -> Vec<Command> {
        self.cursor = (cursor != b"0").then_some(cursor);
        let ours = keys
            .into_iter()
            .filter(|k| k.starts_with(&self.prefix))
            .collect();
        unlink(ours, slot)
    }

    pub fn is_done(&self) -> bool {
        self.cursor.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(command: &Command) -> Vec<String> {
        command
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    #[test]
    fn each_algorithm_has_its_key() {
        let [fixed, sliding, bucket] = keys_of(b"app:", b"ip:1");
        assert_eq!(fixed, b"app:ip:1");
        assert_eq!(sliding, b"app:ip:1:sw");
        assert_eq!(bucket, b"app:ip:1:tb");
    }

    #[test]
    fn reset_is_one_unlink_on_one_server() {
        let commands = reset(b"p:", b"k", |_| 0);
        assert_eq!(commands.len(), 1);
        assert_eq!(text(&commands[0]), ["UNLINK", "p:k", "p:k:sw", "p:k:tb"]);
    }

    #[test]
    fn reset_splits_by_slot() {
        let slot = |k: &[u8]| u16::from(k.ends_with(b":sw"));
        let commands: Vec<_> = reset(b"p:", b"k", slot).iter().map(text).collect();
        assert_eq!(
            commands,
            [vec!["UNLINK", "p:k", "p:k:tb"], vec!["UNLINK", "p:k:sw"]]
        );
    }

    #[test]
    fn the_pattern_escapes_glob_characters() {
        assert_eq!(match_pattern(b"app:"), b"app:*");
        assert_eq!(match_pattern(br"a*b?[c]\d"), br"a\*b\?\[c\]\\d*");
    }

    #[test]
    fn an_empty_prefix_is_refused() {
        let e = ResetAll::new(b"").unwrap_err();
        assert_eq!(e.code(), "ERR_CONFIG");
        assert!(e.to_string().contains("empty prefix"));
    }

    #[test]
    fn scans_until_the_cursor_is_back_at_zero() {
        let mut all = ResetAll::new(b"p:").unwrap();
        assert_eq!(
            text(&all.next_scan().unwrap()),
            ["SCAN", "0", "MATCH", "p:*", "COUNT", "1000"]
        );
        let unlinks = all.on_scan_reply(
            b"17".to_vec(),
            vec![b"p:a".to_vec(), b"other".to_vec()],
            |_| 0,
        );
        assert_eq!(
            unlinks.iter().map(text).collect::<Vec<_>>(),
            [vec!["UNLINK", "p:a"]]
        );
        assert_eq!(text(&all.next_scan().unwrap())[1], "17");
        assert!(all.on_scan_reply(b"0".to_vec(), vec![], |_| 0).is_empty());
        assert!(all.is_done());
        assert_eq!(all.next_scan(), None);
    }

    #[test]
    fn unlinks_come_in_batches() {
        let mut all = ResetAll::new(b"p:").unwrap();
        let keys: Vec<Vec<u8>> = (0..2_500).map(|i| format!("p:{i}").into_bytes()).collect();
        let unlinks = all.on_scan_reply(b"0".to_vec(), keys, |_| 0);
        let sizes: Vec<usize> = unlinks.iter().map(|c| c.len() - 1).collect();
        assert_eq!(sizes, [1_000, 1_000, 500]);
    }
}
