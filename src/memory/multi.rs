//! Several takes as one step: a limiter's limits on a key (a burst window
//! and a daily one, say), each on a key of its own, taken from all or from
//! none, under every shard lock they need at once. So a check refused by
//! one limit never holds room in another, not even for a moment: no other
//! call, on any thread, sees a count it took and then gave back.

use std::sync::MutexGuard;

use super::shard::Shard;
use super::states::{apply, keys, Write};
use super::{KeyHash, Table};
use crate::errors::Result;
use crate::ops::{check_step, Answer, Args, Op};

/// One take of a step: a limit-aware op on its key.
#[derive(Clone, Copy, Debug)]
pub struct Take {
    pub key: KeyHash,
    pub op: Op,
    pub args: Args,
}

impl Table {
    /// Runs `takes` as one step: each op at the time read under its key's
    /// shard lock, with every lock they need held at once (taken in shard
    /// order, so two steps never wait on each other). When every take
    /// allows, all their writes are made; when one refuses, none is, and
    /// the answers are as each take found its key (an allowing take's
    /// answer then says what it would have left: JavaScript adds its cost
    /// back). Answers `(all allowed, each take's answer)`. On error nothing
    /// changed.
    pub fn run_takes(
        &self,
        takes: &[Take],
        clock: impl Fn() -> u64,
    ) -> Result<(bool, Vec<Answer>)> {
        check_step(takes.iter().map(|t| t.op))?;
        let mut shards: Vec<usize> = takes.iter().map(|t| Self::shard_of(t.key)).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut counted = false;
        loop {
            let mut guards: Vec<(usize, MutexGuard<'_, Shard>, u64)> =
                Vec::with_capacity(shards.len());
            for &s in &shards {
                let mut shard = self.lock(s)?;
                let now = shard.tick(clock());
                guards.push((s, shard, now));
            }
            if !std::mem::replace(&mut counted, true) {
                for t in takes {
                    let at = Self::guard_of(&guards, t.key);
                    guards[at].1.tally.calls += 1;
                }
            }
            let mut answers = Vec::with_capacity(takes.len());
            let mut planned: Vec<([KeyHash; 3], usize, [Write; 3], usize)> =
                Vec::with_capacity(takes.len());
            for t in takes {
                let at = Self::guard_of(&guards, t.key);
                let (_, shard, now) = &guards[at];
                let (ks, n) = keys(t.key, t.op, &t.args);
                let mut held = [None; 3];
                for (h, &k) in held.iter_mut().zip(&ks[..n]) {
                    // A counter an earlier take of the step writes is read as it leaves it.
                    let written = planned.iter().rev().find_map(|(pks, pn, writes, _)| {
                        pks[..*pn]
                            .iter()
                            .zip(writes)
                            .rev()
                            .find_map(|(&pk, w)| match w {
                                _ if pk != k => None,
                                Write::Keep => None,
                                Write::Put(c, _) => Some(Some(*c)),
                                Write::Drop => Some(None),
                            })
                    });
                    // An ended counter the sweeper has not dropped yet counts as none.
                    *h = written
                        .unwrap_or_else(|| shard.find(k).map(|id| shard.get(id)))
                        .filter(|c| c.reset_ms(*now).is_some());
                }
                let (answer, writes) = apply(t.op, &t.args, held, *now)?;
                answers.push(answer);
                planned.push((ks, n, writes, at));
            }
            let allowed = answers.iter().all(|a| a.values[0] == 1);
            if !allowed {
                return Ok((false, answers));
            }
            // Keys new to their shard, each once (two takes may put the same).
            let mut new_keys: Vec<KeyHash> = planned
                .iter()
                .flat_map(|(ks, n, writes, at)| {
                    let shard = &guards[*at].1;
                    ks[..*n]
                        .iter()
                        .zip(writes)
                        .filter(|&(&k, w)| matches!(w, Write::Put(..)) && shard.find(k).is_none())
                        .map(|(&k, _)| k)
                        .collect::<Vec<_>>()
                })
                .collect();
            new_keys.sort_unstable();
            new_keys.dedup();
            let new = new_keys.len();
            if new > 0 && !self.reserve_n(new) {
                // Release every shard before making room in one, then look again.
                drop(guards);
                self.make_room(&clock)?;
                continue;
            }
            let mut reindexed = vec![false; guards.len()];
            for (ks, n, writes, at) in planned {
                let shard = &mut guards[at].1;
                for (&k, w) in ks[..n].iter().zip(writes) {
                    match (shard.find(k), w) {
                        (_, Write::Keep) | (None, Write::Drop) => {}
                        (Some(id), Write::Put(c, window_ms)) => {
                            reindexed[at] |= shard.put(id, c, window_ms)
                        }
                        (None, Write::Put(c, window_ms)) => {
                            shard.insert(k, c, window_ms);
                            reindexed[at] = true;
                        }
                        (Some(id), Write::Drop) => {
                            shard.remove(id);
                            self.len.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                            reindexed[at] = true;
                        }
                    }
                }
            }
            for (at, (s, shard, _)) in guards.iter().enumerate() {
                if reindexed[at] {
                    self.publish(*s, shard);
                }
            }
            return Ok((true, answers));
        }
    }

    /// Where in `guards` (sorted by shard) the shard of `key` is.
    fn guard_of(guards: &[(usize, MutexGuard<'_, Shard>, u64)], key: KeyHash) -> usize {
        let s = Self::shard_of(key);
        guards
            .binary_search_by_key(&s, |(at, _, _)| *at)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const MS: u64 = 1000;

    fn take(t: &Table, key: &str, op: Op, n: [f64; 4]) -> Take {
        let units: Vec<u16> = key.encode_utf16().collect();
        Take {
            key: t.key(&units),
            op,
            args: op.check(n).unwrap(),
        }
    }

    #[test]
    fn every_take_allows_or_none_is_made() {
        let t = Table::new(1_000);
        let burst = take(&t, "k:burst", Op::Consume, [1_000.0, 2.0, 1.0, 0.0]);
        let daily = take(&t, "k:daily", Op::Consume, [86_400_000.0, 5.0, 1.0, 0.0]);
        let now = 10_000 * MS;
        for _ in 0..2 {
            let (allowed, _) = t.run_takes(&[burst, daily], || now).unwrap();
            assert!(allowed);
        }
        // Burst refuses: daily keeps its 2.
        let (allowed, answers) = t.run_takes(&[burst, daily], || now).unwrap();
        assert!(!allowed);
        assert_eq!(answers[0].values[0], 0);
        assert_eq!((answers[1].values[0], answers[1].values[1]), (1, 3));
        let read = take(&t, "k:daily", Op::Consume, [86_400_000.0, 5.0, 0.0, 0.0]);
        let a = t.run(read.key, || now, read.op, &read.args).unwrap();
        assert_eq!(a.values[1], 2);
    }

    #[test]
    fn a_bucket_keeps_its_tokens_when_a_window_refuses() {
        let t = Table::new(1_000);
        let window = take(&t, "k:w", Op::Consume, [60_000.0, 0.0, 1.0, 0.0]);
        let bucket = take(&t, "k:b", Op::Bucket, [3.0, 1.0, 1_000.0, 1.0]);
        let (allowed, answers) = t.run_takes(&[window, bucket], || MS).unwrap();
        assert!(!allowed);
        assert_eq!(answers[1].values[..2], [1, 2]);
        let alone = t.run_takes(&[bucket], || MS).unwrap();
        assert_eq!(alone.1[0].values[..2], [1, 2], "the bucket was still full");
    }

    #[test]
    fn a_later_take_on_the_same_key_sees_the_earlier_one() {
        let t = Table::new(1_000);
        let a = take(&t, "k", Op::Consume, [60_000.0, 3.0, 2.0, 0.0]);
        let (allowed, answers) = t.run_takes(&[a, a], || MS).unwrap();
        assert!(!allowed);
        assert_eq!((answers[0].values[0], answers[1].values[0]), (1, 0));
        let b = take(&t, "k", Op::Consume, [60_000.0, 4.0, 2.0, 0.0]);
        let (allowed, answers) = t.run_takes(&[b, b], || MS).unwrap();
        assert!(allowed);
        assert_eq!(answers[1].values[1], 4);
        let read = take(&t, "k", Op::Consume, [60_000.0, 4.0, 0.0, 0.0]);
        assert_eq!(
            t.run(read.key, || MS, read.op, &read.args).unwrap().values[1],
            4
        );
    }

    #[test]
    fn refuses_what_is_not_a_take() {
        let t = Table::new(10);
        let hit = take(&t, "k", Op::Hit, [1_000.0, 1.0, 0.0, 0.0]);
        assert!(t.run_takes(&[hit], || MS).is_err());
        assert!(t.run_takes(&[], || MS).is_err());
    }

    #[test]
    fn threads_never_see_a_take_given_back() {
        // Burst 7 and daily 20 taken together by one thread, daily alone by
        // another: daily lets exactly 20 through.
        let t = Arc::new(Table::new(10_000));
        let burst = take(&t, "k:burst", Op::Consume, [600_000.0, 7.0, 1.0, 0.0]);
        let daily = take(&t, "k:daily", Op::Consume, [86_400_000.0, 20.0, 1.0, 0.0]);
        let run = |steps: Vec<Take>| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                (0..40)
                    .filter(|_| t.run_takes(&steps, crate::clock::now_us).unwrap().0)
                    .count()
            })
        };
        let both = run(vec![burst, daily]);
        let one = run(vec![daily]);
        let (both, one) = (both.join().unwrap(), one.join().unwrap());
        assert_eq!(both + one, 20);
        assert!(both <= 7);
    }
}
