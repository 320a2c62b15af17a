//! memoryStore's table: counters in Rust memory, off the V8 heap.
//!
//! Keys are kept as a 128-bit SipHash-1-3 under a random per-table key: the
//! same size for every key length, no key text in memory, and no way for a
//! client to pick colliding keys. Each counter takes 32 bytes in one of 64
//! shards, so the table grows one small shard at a time, never in one long
//! copy.

mod lock;
mod shard;

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::clock;
use crate::errors::{Error, Result};
use crate::window::{self, Change, Outcome};
use lock::{Guard, SpinLock};
use shard::{Found, Shard, Slot};

/// Enough shards that one growing shard holds a small part of the table.
const SHARDS: usize = 64;
/// How often the sweeper gives back the memory of ended windows.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// A key, hashed: the table never holds key text.
pub type KeyHash = u128;

/// A shard and its lock on a cache line of their own, so that threads
/// working on neighbouring shards don't share a line.
#[repr(align(64))]
struct Locked(SpinLock<Shard>);

pub struct Table {
    shards: Box<[Locked]>,
    /// Counters held, kept beside the shards so a hit needn't lock them all.
    len: AtomicUsize,
    max_keys: usize,
    sip: (u64, u64),
}

impl Table {
    pub fn new(max_keys: usize) -> Table {
        let shards = (0..SHARDS)
            .map(|_| Locked(SpinLock::new(Shard::new())))
            .collect();
        Table {
            shards,
            len: AtomicUsize::new(0),
            max_keys,
            sip: (rand::random(), rand::random()),
        }
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Counters held now, ended windows not yet swept included.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hashes a key given as UTF-16 code units, as JavaScript holds it.
    pub fn key(&self, utf16: &[u16]) -> KeyHash {
        // SAFETY: any u16 slice is also a valid byte slice of twice the length.
        let bytes =
            unsafe { std::slice::from_raw_parts(utf16.as_ptr().cast::<u8>(), utf16.len() * 2) };
        let mut h = SipHasher13::new_with_keys(self.sip.0, self.sip.1);
        h.write(bytes);
        h.finish128().as_u128()
    }

    /// The key's shard, chosen by its high bits (its slot uses the low ones).
    fn shard(&self, key: KeyHash) -> &SpinLock<Shard> {
        &self.shards[(key >> (128 - SHARDS.trailing_zeros())) as usize].0
    }

    /// One hit, at the time `clock` (µs on the process clock) reads once the
    /// key's shard is locked: a thread that was held up before the lock cannot
    /// apply an older time to a window opened meanwhile. On error nothing changed.
    pub fn hit(
        &self,
        key: KeyHash,
        clock: impl Fn() -> u64,
        window_ms: u64,
        amount: i64,
    ) -> Result<Outcome> {
        loop {
            let mut shard = lock(self.shard(key))?;
            let now = shard.tick(clock());
            match shard.find(key) {
                Found::At(i) => {
                    let outcome =
                        window::hit(Some(shard.get(i).counter()), now, window_ms, amount)?;
                    match outcome.change {
                        Change::Keep => {}
                        Change::Put(c) => shard.set(i, Slot::new(key, c)),
                        Change::Drop => {
                            shard.remove(i);
                            self.len.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    return Ok(outcome);
                }
                Found::Vacant(i) => {
                    let outcome = window::hit(None, now, window_ms, amount)?;
                    if let Change::Put(c) = outcome.change {
                        if !self.reserve() {
                            // Release the shard before touching the others.
                            drop(shard);
                            self.make_room(&clock)?;
                            continue;
                        }
                        shard.insert(i, Slot::new(key, c));
                    }
                    return Ok(outcome);
                }
            }
        }
    }

    /// Takes a place for a new counter, if there is one.
    fn reserve(&self) -> bool {
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// Frees room for one counter: ended windows first, then the soonest-ending
    /// short ones. Long windows (budgets) are never dropped: the hit fails instead.
    fn make_room(&self, clock: &impl Fn() -> u64) -> Result<()> {
        if self.sweep(clock) > 0 || self.len() < self.max_keys {
            return Ok(());
        }
        let mut short: Vec<(u64, KeyHash)> = Vec::new();
        for locked in self.shards.iter() {
            short.extend(lock(&locked.0)?.slots().filter_map(|s| {
                let c = s.counter();
                (!c.long).then_some((c.ends_at, s.key()))
            }));
        }
        if short.is_empty() {
            return Err(Error::StoreFull(self.max_keys));
        }
        // Evict a small batch at once, so a full store doesn't scan on every hit.
        let batch = (self.max_keys / 64).clamp(1, short.len());
        if batch < short.len() {
            short.select_nth_unstable(batch - 1);
            short.truncate(batch);
        }
        for (ends_at, key) in short {
            let mut shard = lock(self.shard(key))?;
            if let Found::At(i) = shard.find(key) {
                let c = shard.get(i).counter();
                if !c.long && c.ends_at == ends_at {
                    shard.remove(i);
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Drops every counter whose window has ended and gives back memory when
    /// a shard is mostly empty. Returns how many were dropped.
    pub fn sweep(&self, clock: impl Fn() -> u64) -> usize {
        let mut dropped = 0;
        for locked in self.shards.iter() {
            let Ok(mut shard) = lock(&locked.0) else {
                continue;
            };
            let now = shard.tick(clock());
            let gone = shard.retain(|s| s.counter().reset_ms(now).is_some());
            self.len.fetch_sub(gone, Ordering::Relaxed);
            if gone > 0 {
                shard.shrink();
            }
            dropped += gone;
        }
        dropped
    }
}

/// A shard's lock. A panic while one was held may have left it half changed:
/// fail loudly rather than count from it.
fn lock(shard: &SpinLock<Shard>) -> Result<Guard<'_, Shard>> {
    shard.lock().map_err(poisoned)
}

/// Opens a table: a private one, or the process-wide one of that name, which
/// every module and worker thread of the process that asks for it shares.
pub fn open(name: Option<&str>, max_keys: usize) -> Result<Arc<Table>> {
    let Some(name) = name else {
        let table = Arc::new(Table::new(max_keys));
        sweep_later(&table)?;
        return Ok(table);
    };
    static NAMED: OnceLock<Mutex<HashMap<String, Arc<Table>>>> = OnceLock::new();
    let mut named = NAMED
        .get_or_init(Default::default)
        .lock()
        .map_err(poisoned)?;
    if let Some(table) = named.get(name) {
        if table.max_keys() != max_keys {
            return Err(Error::InvalidRange(
                "a memoryStore of this name already exists with another maxKeys",
            ));
        }
        return Ok(Arc::clone(table));
    }
    let table = Arc::new(Table::new(max_keys));
    // Once per table: a name opened again is swept already.
    sweep_later(&table)?;
    named.insert(name.to_owned(), Arc::clone(&table));
    Ok(table)
}

fn poisoned<T>(_: T) -> Error {
    Error::Internal("a lock was poisoned by an earlier panic")
}

/// The tables the sweeper thread visits, each once; a table no store holds
/// any more is let go on its next round.
static SWEPT: OnceLock<Mutex<Vec<Weak<Table>>>> = OnceLock::new();

/// Registers a new table with the one sweeper thread of the process. A native
/// thread never keeps Node.js alive, so an idle store lets the process exit.
fn sweep_later(table: &Arc<Table>) -> Result<()> {
    let mut first = false;
    let tables = SWEPT.get_or_init(|| {
        first = true;
        Mutex::default()
    });
    tables.lock().map_err(poisoned)?.push(Arc::downgrade(table));
    if first {
        std::thread::Builder::new()
            .name("ratestore-sweeper".into())
            .spawn(move || loop {
                std::thread::sleep(SWEEP_EVERY);
                let live: Vec<Arc<Table>> = match tables.lock() {
                    Ok(mut t) => {
                        t.retain(|w| w.strong_count() > 0);
                        t.iter().filter_map(Weak::upgrade).collect()
                    }
                    Err(_) => return,
                };
                for table in live {
                    table.sweep(clock::now_us);
                }
            })
            .map_err(|_| Error::Internal("could not start the sweeper thread"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::SHORT_WINDOW_MS;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicU64;

    const MS: u64 = 1000;

    fn key(t: &Table, s: &str) -> KeyHash {
        t.key(&s.encode_utf16().collect::<Vec<_>>())
    }

    #[test]
    fn keys_hash_apart_and_per_table() {
        let t = Table::new(10);
        assert_ne!(key(&t, "a"), key(&t, "b"));
        assert_ne!(key(&t, ""), key(&t, "\0"));
        assert_ne!(key(&t, "ab"), key(&t, "\u{6261}"));
        assert_eq!(key(&t, "1.2.3.4"), key(&t, "1.2.3.4"));
        assert_ne!(key(&t, "1.2.3.4"), key(&Table::new(10), "1.2.3.4"));
    }

    #[test]
    fn ended_windows_are_swept() {
        let t = Table::new(10);
        t.hit(1, || 0, 10, 1).unwrap();
        t.hit(2, || 0, 1_000, 1).unwrap();
        assert_eq!(t.sweep(|| 5 * MS), 0);
        assert_eq!(t.sweep(|| 10 * MS), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.hit(2, || 10 * MS, 1_000, 0).unwrap().count, 1);
    }

    #[test]
    fn a_read_of_an_ended_window_drops_it() {
        let t = Table::new(10);
        t.hit(1, || 0, 10, 1).unwrap();
        assert_eq!(t.hit(1, || 10 * MS, 50, 0).unwrap().count, 0);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn full_drops_ended_windows_first() {
        let t = Table::new(2);
        t.hit(1, || 0, 10, 1).unwrap();
        t.hit(2, || 0, 60_000, 1).unwrap();
        t.hit(3, || 20 * MS, 60_000, 1).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.hit(2, || 20 * MS, 60_000, 0).unwrap().count, 1);
        assert_eq!(t.hit(3, || 20 * MS, 60_000, 0).unwrap().count, 1);
    }

    #[test]
    fn full_then_drops_the_soonest_ending_short_window() {
        let t = Table::new(3);
        t.hit(1, || 0, 30_000, 1).unwrap();
        t.hit(2, || 0, 10_000, 1).unwrap(); // ends first
        t.hit(3, || 0, 20_000, 1).unwrap();
        t.hit(4, || MS, 60_000, 1).unwrap();
        assert_eq!(t.hit(2, || MS, 60_000, 0).unwrap().count, 0);
        for k in [1, 3, 4] {
            assert_eq!(t.hit(k, || MS, 60_000, 0).unwrap().count, 1, "key {k}");
        }
    }

    #[test]
    fn full_of_long_windows_refuses_and_changes_nothing() {
        let t = Table::new(2);
        let day = 24 * SHORT_WINDOW_MS;
        t.hit(1, || 0, day, 5).unwrap();
        t.hit(2, || 0, SHORT_WINDOW_MS + 1, 5).unwrap();
        assert_eq!(t.hit(3, || MS, 60_000, 1), Err(Error::StoreFull(2)));
        assert_eq!(t.len(), 2);
        // Reads and hits on held keys need no room.
        assert_eq!(t.hit(3, || MS, 60_000, 0).unwrap().count, 0);
        assert_eq!(t.hit(1, || MS, day, 1).unwrap().count, 6);
        assert_eq!(t.hit(2, || MS, day, 0).unwrap().count, 5);
    }

    #[test]
    fn a_short_window_is_dropped_before_a_budget() {
        let t = Table::new(2);
        t.hit(1, || 0, 2 * SHORT_WINDOW_MS, 5).unwrap();
        t.hit(2, || 0, SHORT_WINDOW_MS, 5).unwrap();
        t.hit(3, || MS, 2 * SHORT_WINDOW_MS, 1).unwrap();
        assert_eq!(t.hit(1, || MS, 1, 0).unwrap().count, 5);
        assert_eq!(t.hit(2, || MS, 1, 0).unwrap().count, 0);
    }

    #[test]
    fn threads_lose_no_update() {
        let t = Arc::new(Table::new(100));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    (0..10_000)
                        .map(|_| t.hit(7, || 0, 60_000, 1).unwrap().count)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<i64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (1..=40_000).collect::<Vec<_>>());
    }

    #[test]
    fn many_keys_spread_over_shards_and_are_swept() {
        let t = Table::new(100_000);
        let keys: Vec<KeyHash> = (0..20_000).map(|i| key(&t, &format!("k{i}"))).collect();
        for (i, &k) in keys.iter().enumerate() {
            let window = if i % 2 == 0 { 10 } else { 60_000 };
            assert_eq!(t.hit(k, || 0, window, 1).unwrap().count, 1);
        }
        for &k in &keys {
            assert_eq!(t.hit(k, || MS, 60_000, 1).unwrap().count, 2);
        }
        assert_eq!(t.len(), 20_000);
        assert_eq!(t.sweep(|| 20 * MS), 10_000);
        for (i, &k) in keys.iter().enumerate() {
            let want = if i % 2 == 0 { 0 } else { 2 };
            assert_eq!(t.hit(k, || 20 * MS, 60_000, 0).unwrap().count, want);
        }
        assert_eq!(t.sweep(|| 61 * MS * 1000), 10_000);
        assert!(t.is_empty());
    }

    /// A fake clock that gains 1 ms on every read; reads on `slow` threads
    /// then pause, as a thread preempted right after reading the clock.
    fn ticking(time: &Arc<AtomicU64>, slow: bool) -> impl Fn() -> u64 {
        let time = Arc::clone(time);
        move || {
            let now = time.fetch_add(MS, Ordering::SeqCst);
            if slow {
                std::thread::sleep(Duration::from_millis(3));
            }
            now
        }
    }

    #[test]
    fn a_thread_held_up_after_reading_the_clock_applies_no_older_time() {
        let t = Arc::new(Table::new(10));
        let time = Arc::new(AtomicU64::new(MS));
        let handles: Vec<_> = [(true, 30), (false, 3_000)]
            .into_iter()
            .map(|(slow, hits)| {
                let (t, clock) = (Arc::clone(&t), ticking(&time, slow));
                std::thread::spawn(move || {
                    (0..hits)
                        .map(|_| t.hit(7, &clock, 1, 1).unwrap().reset_ms)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for reset_ms in h.join().unwrap() {
                assert!(reset_ms <= 1, "resetMs {reset_ms} for a 1 ms window");
            }
        }
    }

    #[test]
    fn time_per_key_never_runs_back() {
        let t = Table::new(10);
        t.hit(1, || 10 * MS, 5, 1).unwrap();
        // A clock read that is older than the last one applied counts as the last.
        assert_eq!(t.hit(1, || 0, 5, 1).unwrap().reset_ms, 5);
        assert_eq!(t.hit(1, || 12 * MS, 5, 1).unwrap().reset_ms, 3);
        assert_eq!(t.hit(1, || 0, 5, 1).unwrap().reset_ms, 3);
    }

    #[test]
    fn a_name_opened_again_is_swept_once() {
        let table = open(Some("memory-test-sweeper"), 5).unwrap();
        for _ in 0..100_000 {
            open(Some("memory-test-sweeper"), 5).unwrap();
        }
        let swept = SWEPT.get().unwrap().lock().unwrap();
        let entries = swept.iter().filter(|w| w.as_ptr() == Arc::as_ptr(&table));
        assert_eq!(entries.count(), 1);
    }

    #[test]
    fn a_name_opens_one_table_for_the_process() {
        let a = open(Some("memory-test-name"), 5).unwrap();
        let b = open(Some("memory-test-name"), 5).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(open(Some("memory-test-name"), 6).is_err());
        assert!(!Arc::ptr_eq(
            &open(None, 5).unwrap(),
            &open(None, 5).unwrap()
        ));
    }

    /// The rules written out plainly, with no eviction: the table must agree.
    #[derive(Default)]
    struct Model(HashMap<KeyHash, (i64, u64)>);

    impl Model {
        fn hit(&mut self, key: KeyHash, now: u64, window_ms: u64, amount: i64) -> (i64, u64) {
            match self.0.get_mut(&key) {
                Some((count, end)) if *end >= now + MS => {
                    *count += amount;
                    (*count, (*end - now).div_ceil(MS))
                }
                _ if amount == 0 => (0, window_ms),
                _ => {
                    self.0.insert(key, (amount, now + window_ms * MS));
                    (amount, window_ms)
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_table_agrees_with_the_model(
            ops in prop::collection::vec((0u128..6, 0u64..3_000_000, 1u64..4_000, -5i64..6), 1..200)
        ) {
            let table = Table::new(1_000);
            let mut model = Model::default();
            let mut now = 0;
            for (key, step, window_ms, amount) in ops {
                now += step;
                if step % 7 == 0 {
                    table.sweep(|| now);
                }
                let o = table.hit(key, || now, window_ms, amount).unwrap();
                prop_assert_eq!((o.count, o.reset_ms), model.hit(key, now, window_ms, amount));
            }
        }
    }
}
