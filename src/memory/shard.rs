//! One shard of the memory table. Its counters sit in the slots of a
//! `hashbrown::HashTable`, found by key in one probe, and are kept in order
//! of their ends by an expiry index, so that what to sweep or evict is found
//! without a scan:
//!
//! - A counter's end falls in a bucket 1/256 of its window long (windows are
//!   grouped by their power of two, so each group has its own bucket length).
//! - Each bucket is a list linked through the counters themselves (two `u32`
//!   slot numbers each), in the order its counters were opened: for windows
//!   of one length, the order they end.
//! - Two ordered maps from a bucket's start to the head of its list, one for
//!   short windows (evicted when the table is full) and one for long ones
//!   (never evicted, only dropped once ended). Only buckets in use take room.
//!
//! The links name slots, so a counter must never move while it is listed.
//! `HashTable` moves its values only when it grows or rehashes, and it does
//! that only on an insert that finds no room (`capacity() == len()`) or on
//! `shrink_to`; the shard never lets it: it moves every counter itself
//! ([`Shard::rebuild`]), into a new table, and renames the links as it goes.

use std::collections::BTreeMap;

use hashbrown::HashTable;

use super::KeyHash;
use crate::window::Counter;

/// Ends are kept to 2^56 µs (2,284 years) of the process clock, so that the
/// top byte of `Entry::end` holds the window's group and its long flag.
const END_MASK: u64 = (1 << 56) - 1;
const GROUP_SHIFT: u32 = 56;
const LONG_BIT: u64 = 1 << 63;
/// A bucket is 1/2^8 of the shortest window of its group.
const BUCKETS_PER_WINDOW_LOG2: u32 = 8;
/// Slot numbers are `u32`: a shard's table has fewer than 2^32 slots.
const NONE: u32 = u32::MAX;

/// A key and its counter, with its place in its bucket's list: 40 bytes.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The key hash, as two halves (a `u128` field would align the entry to 16 bytes).
    key: [u64; 2],
    count: i64,
    /// The window's end (µs, low 56 bits), its group (the window's length
    /// in µs, log 2, 6 bits) and, in the top bit, the long flag.
    end: u64,
    /// The slots of the entries before and after this one in its bucket's
    /// list (a ring: the head's `prev` is the tail).
    prev: u32,
    next: u32,
}

impl Entry {
    #[cfg(test)]
    fn key(&self) -> KeyHash {
        (self.key[1] as u128) << 64 | self.key[0] as u128
    }

    fn ends_at(&self) -> u64 {
        self.end & END_MASK
    }

    fn long(&self) -> bool {
        self.end & LONG_BIT != 0
    }

    fn counter(&self) -> Counter {
        Counter {
            count: self.count,
            ends_at: self.ends_at(),
            long: self.long(),
        }
    }

    /// The key of this entry's bucket in its map: the bucket's start, then its group.
    fn bucket(&self) -> u64 {
        let group = (self.end >> GROUP_SHIFT) & 0x3f;
        bucket_start(self.ends_at(), group) << 6 | group
    }
}

/// The hash the table places an entry by.
fn entry_hash(e: &Entry) -> u64 {
    e.key[0]
}

/// Asks the CPU to bring a key's home slot and its control bytes into the
/// cache, given a shard's [`Shard::layout`] read without its lock, so that
/// the miss overlaps the lock and the clock. The addresses are only
/// prefetched, never read: a layout that changed since (or a hashbrown that
/// lays slots out otherwise) costs a wasted prefetch, never a wrong value.
#[inline]
pub fn prefetch(key: KeyHash, (base, mask): (usize, usize)) {
    if base == 0 {
        return;
    }
    let home = key as u64 as usize & mask;
    let slot = base.wrapping_sub((home + 1) * std::mem::size_of::<Entry>());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // A 40-byte slot may straddle two lines.
        for line in [slot, slot + std::mem::size_of::<Entry>() - 1, base + home] {
            // SAFETY: SSE, which `_mm_prefetch` needs, is part of x86_64's
            // baseline; a prefetch never faults and reads nothing, whatever
            // the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

fn bucket_start(ends_at: u64, group: u64) -> u64 {
    let shift = group.saturating_sub(BUCKETS_PER_WINDOW_LOG2 as u64);
    ends_at >> shift << shift
}

/// When a bucket (a key of a map) starts and ends, in µs.
fn bucket_span(bucket: u64) -> (u64, u64) {
    let group = bucket & 0x3f;
    let start = bucket >> 6;
    let len = 1 << group.saturating_sub(BUCKETS_PER_WINDOW_LOG2 as u64);
    (start, start.saturating_add(len))
}

/// The packed end of a counter opened with a window of `window_ms`.
fn packed_end(c: Counter, window_ms: u64) -> u64 {
    let window_us = window_ms.saturating_mul(1000).max(1);
    let group = u64::from(63 - window_us.leading_zeros()).min(63);
    let long = if c.long { LONG_BIT } else { 0 };
    c.ends_at.min(END_MASK) | group << GROUP_SHIFT | long
}

#[derive(Default)]
pub struct Shard {
    /// The counters, by key; their slots never change while they are held
    /// but in [`Shard::rebuild`].
    table: HashTable<Entry>,
    short: BTreeMap<u64, u32>,
    long: BTreeMap<u64, u32>,
    /// The latest time a hit here was applied at: time per key never runs back.
    now: u64,
    /// What happened here, counted under the shard's lock.
    pub tally: Tally,
}

/// A shard's counts of what it did: plain integers, changed only under its
/// lock, so counting costs a hit no shared cache line.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Tally {
    /// Calls that ran here (every op, a read included).
    pub calls: u64,
    /// Ended windows dropped to make room for a new counter.
    pub evicted_ended: u64,
    /// Short windows (at most one hour) dropped before their end to make room.
    pub evicted_short: u64,
    /// Ended windows the sweeper dropped.
    pub swept: u64,
}

impl Tally {
    pub fn add(&mut self, other: &Tally) {
        self.calls += other.calls;
        self.evicted_ended += other.evicted_ended;
        self.evicted_short += other.evicted_short;
        self.swept += other.swept;
    }
}

/// A counter held, by its slot in the shard's table (valid until the next change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id(u32);

impl Shard {
    pub fn new() -> Shard {
        Shard::default()
    }

    /// Counters held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// The time to apply a hit at: `now`, or the latest time applied here if
    /// that is later.
    #[inline]
    pub fn tick(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    #[inline]
    pub fn find(&self, key: KeyHash) -> Option<Id> {
        let halves = [key as u64, (key >> 64) as u64];
        self.table
            .find_bucket_index(halves[0], |e| e.key == halves)
            .map(|i| Id(i as u32))
    }

    #[inline]
    fn entry(&self, i: u32) -> &Entry {
        self.table
            .get_bucket(i as usize)
            .expect("a listed slot is full")
    }

    #[inline]
    fn entry_mut(&mut self, i: u32) -> &mut Entry {
        self.table
            .get_bucket_mut(i as usize)
            .expect("a listed slot is full")
    }

    #[inline]
    pub fn get(&self, id: Id) -> Counter {
        self.entry(id.0).counter()
    }

    /// Stores counter `c` for the key at `id`, opened with `window_ms` if it is
    /// a new window. Returns true when the expiry index changed.
    #[inline]
    pub fn put(&mut self, id: Id, c: Counter, window_ms: u64) -> bool {
        let entry = self.entry_mut(id.0);
        entry.count = c.count;
        if c.ends_at.min(END_MASK) == entry.ends_at() && c.long == entry.long() {
            return false;
        }
        self.unlink(id.0);
        self.entry_mut(id.0).end = packed_end(c, window_ms);
        self.link(id.0);
        true
    }

    /// Adds a key that is not held, with a window of `window_ms` just opened.
    pub fn insert(&mut self, key: KeyHash, c: Counter, window_ms: u64) {
        debug_assert!(self.find(key).is_none());
        if self.table.capacity() == self.table.len() {
            // The table would grow inside `insert_unique`, moving every
            // entry under its links: move them here instead.
            self.rebuild(self.grown());
        }
        let slots = self.table.num_buckets();
        let entry = Entry {
            key: [key as u64, (key >> 64) as u64],
            count: c.count,
            end: packed_end(c, window_ms),
            prev: NONE,
            next: NONE,
        };
        let i = self
            .table
            .insert_unique(entry.key[0], entry, entry_hash)
            .bucket_index();
        debug_assert_eq!(slots, self.table.num_buckets(), "the table did not grow");
        self.link(i as u32);
    }

    /// Where the table's slots lie, for [`prefetch`]: the address just past
    /// slot 0 (hashbrown keeps slot i's value i + 1 places below its control
    /// bytes) and the mask that takes a hash to its home slot; `(0, 0)` when
    /// nothing is held.
    pub fn layout(&self) -> (usize, usize) {
        let Some(i) = self.table.iter_buckets().next() else {
            return (0, 0);
        };
        let slot = self.table.get_bucket(i).expect("an index of a full slot");
        let base = (slot as *const Entry as usize) + (i + 1) * std::mem::size_of::<Entry>();
        (base, self.table.num_buckets() - 1)
    }

    /// Drops the counter at `id`. No other counter moves.
    pub fn remove(&mut self, id: Id) {
        self.unlink(id.0);
        self.table
            .get_bucket_entry(id.0 as usize)
            .expect("a listed slot is full")
            .remove();
    }

    /// How many counters the table should have room for when it is full:
    /// hashbrown's own rule (twice the slots, or the same slots without
    /// their tombstones when at most half of them are held).
    fn grown(&self) -> usize {
        let slots = self.table.num_buckets();
        let full = if slots < 8 {
            slots.saturating_sub(1)
        } else {
            slots / 8 * 7
        };
        let n = self.table.len() + 1;
        if n <= full / 2 {
            full
        } else {
            n.max(full + 1)
        }
    }

    /// Moves every counter into a new table with room for `capacity`, and
    /// renames the slots in the lists and the maps' heads: O(counters),
    /// the cost of the rehash it stands in for, plus a pass over the links.
    fn rebuild(&mut self, capacity: usize) {
        let capacity = capacity.max(self.table.len());
        let mut table = HashTable::with_capacity(capacity);
        assert!(
            table.num_buckets() < NONE as usize,
            "a shard's table has fewer than 2^32 - 1 slots"
        );
        let mut renamed = vec![NONE; self.table.num_buckets()];
        for i in self.table.iter_buckets() {
            let e = *self.table.get_bucket(i).expect("an index of a full slot");
            renamed[i] = table.insert_unique(e.key[0], e, entry_hash).bucket_index() as u32;
        }
        for e in table.iter_mut() {
            e.prev = renamed[e.prev as usize];
            e.next = renamed[e.next as usize];
        }
        for head in self.short.values_mut().chain(self.long.values_mut()) {
            *head = renamed[*head as usize];
        }
        self.table = table;
    }

    /// When the first counter of the earliest bucket of short (or long)
    /// windows ends, in µs: `u64::MAX` when none is held.
    pub fn first(&self, long: bool) -> u64 {
        self.earliest(long)
            .map_or(u64::MAX, |id| self.entry(id.0).ends_at())
    }

    /// The first counter of the earliest bucket of short (or long) windows: the
    /// soonest to end, to within its bucket.
    pub fn earliest(&self, long: bool) -> Option<Id> {
        self.map_ref(long).first_key_value().map(|(_, &i)| Id(i))
    }

    /// Drops up to `most` counters whose windows have ended by `now`, found
    /// through the expiry index: every bucket that has ended, whole, and in
    /// each bucket that holds `now` (one per group at most), counters while
    /// the first has ended. Returns how many it dropped.
    pub fn drop_ended(&mut self, now: u64, most: usize) -> usize {
        let mut dropped = 0;
        for long in [false, true] {
            let mut from = 0;
            while dropped < most {
                let Some((&bucket, &head)) = self.map_ref(long).range(from..).next() else {
                    break;
                };
                let (start, end) = bucket_span(bucket);
                if start > now {
                    break;
                }
                if end > now && self.entry(head).counter().reset_ms(now).is_some() {
                    from = bucket + 1;
                    continue;
                }
                self.remove(Id(head));
                dropped += 1;
            }
        }
        dropped
    }

    /// Gives its table's memory back once the shard is mostly empty.
    /// Returns true when it did.
    pub fn shrink(&mut self) -> bool {
        let n = self.table.len();
        // Half full after shrinking, so that it doesn't grow again soon.
        if n * 4 > self.table.capacity().max(16) {
            return false;
        }
        self.rebuild(n * 2);
        true
    }

    fn map(&mut self, long: bool) -> &mut BTreeMap<u64, u32> {
        if long {
            &mut self.long
        } else {
            &mut self.short
        }
    }

    fn map_ref(&self, long: bool) -> &BTreeMap<u64, u32> {
        if long {
            &self.long
        } else {
            &self.short
        }
    }

    /// Appends entry `i` to its bucket's list, making the bucket if need be.
    fn link(&mut self, i: u32) {
        let (bucket, long) = (self.entry(i).bucket(), self.entry(i).long());
        match self.map(long).get(&bucket).copied() {
            None => {
                self.map(long).insert(bucket, i);
                let e = self.entry_mut(i);
                (e.prev, e.next) = (i, i);
            }
            Some(head) => {
                let tail = self.entry(head).prev;
                self.entry_mut(tail).next = i;
                self.entry_mut(head).prev = i;
                let e = self.entry_mut(i);
                (e.prev, e.next) = (tail, head);
            }
        }
    }

    /// Takes entry `i` out of its bucket's list, dropping the bucket if it empties.
    fn unlink(&mut self, i: u32) {
        let e = self.entry(i);
        let (prev, next, bucket, long) = (e.prev, e.next, e.bucket(), e.long());
        if next == i {
            self.map(long).remove(&bucket);
            return;
        }
        self.entry_mut(prev).next = next;
        self.entry_mut(next).prev = prev;
        let head = self
            .map(long)
            .get_mut(&bucket)
            .expect("every entry is listed");
        if *head == i {
            *head = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const MS: u64 = 1000;

    fn counter(count: i64, ends_at: u64, long: bool) -> Counter {
        Counter {
            count,
            ends_at,
            long,
        }
    }

    /// Every entry is indexed and listed once, in a bucket that holds its end.
    fn check(shard: &Shard) {
        let mut listed = 0;
        for long in [false, true] {
            for (&bucket, &head) in shard.map_ref(long) {
                let (start, end) = bucket_span(bucket);
                let mut i = head;
                loop {
                    let e = shard.entry(i);
                    assert_eq!(e.bucket(), bucket);
                    assert_eq!(e.long(), long);
                    assert!((start..end).contains(&e.ends_at()));
                    assert_eq!(shard.entry(e.next).prev, i);
                    assert_eq!(shard.find(e.key()), Some(Id(i)));
                    listed += 1;
                    i = e.next;
                    if i == head {
                        break;
                    }
                }
            }
        }
        assert_eq!(listed, shard.len());
    }

    #[test]
    fn entries_are_forty_bytes_and_round_trip() {
        assert_eq!(std::mem::size_of::<Entry>(), 40);
        let mut shard = Shard::new();
        let c = counter(-crate::window::MAX_SAFE, 123 * MS, true);
        let key = u128::MAX - 5;
        shard.insert(key, c, 2);
        assert_eq!(shard.get(shard.find(key).unwrap()), c);
        assert_eq!(shard.find(key - 1), None);
    }

    #[test]
    fn ends_past_the_clock_range_are_clamped() {
        let mut shard = Shard::new();
        shard.insert(1, counter(1, u64::MAX, true), u64::MAX / 1000);
        assert_eq!(shard.get(shard.find(1).unwrap()).ends_at, END_MASK);
        assert_eq!(shard.drop_ended(END_MASK - 1_000, 10), 0);
        assert_eq!(shard.drop_ended(END_MASK - 999, 10), 1);
        check(&shard);
    }

    #[test]
    fn the_earliest_bucket_comes_first_and_ended_ones_go() {
        let mut shard = Shard::new();
        shard.insert(1, counter(1, 30_000 * MS, false), 30_000);
        shard.insert(2, counter(1, 10_000 * MS, false), 10_000);
        shard.insert(3, counter(1, 20_000 * MS, false), 20_000);
        shard.insert(4, counter(1, 5_000 * MS, true), 5_000);
        assert_eq!(
            shard.get(shard.earliest(false).unwrap()).ends_at,
            10_000 * MS
        );
        assert_eq!(shard.first(false), 10_000 * MS);
        assert_eq!(shard.get(shard.earliest(true).unwrap()).ends_at, 5_000 * MS);
        assert_eq!(shard.drop_ended(10_000 * MS, 10), 2);
        assert_eq!(shard.len(), 2);
        assert_eq!(shard.first(true), u64::MAX);
        check(&shard);
    }

    #[test]
    fn a_bucket_keeps_the_order_counters_were_opened_in() {
        let mut shard = Shard::new();
        // One bucket: 60 s windows, 1/256 of which is 234 ms.
        for k in 0..100u128 {
            shard.insert(k, counter(1, 60_000 * MS + k as u64, false), 60_000);
        }
        for k in 0..100u128 {
            let first = shard.earliest(false).unwrap();
            assert_eq!(shard.find(k), Some(first));
            shard.remove(first);
            check(&shard);
        }
        assert!(shard.short.is_empty());
    }

    #[test]
    fn grows_and_shrinks() {
        let mut shard = Shard::new();
        for k in 0..10_000u128 {
            shard.insert(
                k << 64 | k,
                counter(k as i64, (1 + k as u64 % 50) * MS, false),
                60,
            );
        }
        check(&shard);
        assert_eq!(shard.drop_ended(45 * MS, usize::MAX), 9_000);
        assert!(shard.shrink());
        assert!(shard.table.capacity() < 4_000);
        check(&shard);
        for k in 0..10_000u128 {
            let held = shard.find(k << 64 | k).map(|id| shard.get(id).count);
            assert_eq!(held, (k % 50 >= 45).then_some(k as i64), "key {k}");
        }
    }

    #[test]
    fn counters_keep_their_slots_until_the_table_is_rebuilt() {
        let mut shard = Shard::new();
        let key = |k: u64| (k as u128 + 1) << 64 | k as u128;
        let mut slots = 0;
        let mut rebuilt = 0;
        for k in 0..5_000u64 {
            let before: Vec<_> = (0..k).step_by(97).map(|j| shard.find(key(j))).collect();
            shard.insert(
                key(k),
                counter(k as i64, (k % 300 + 1) * MS, k % 7 == 0),
                60,
            );
            if k % 3 == 0 {
                // Tombstones: removals leave slots the table reuses or rehashes away.
                shard.remove(shard.find(key(k)).unwrap());
                shard.insert(key(k), counter(k as i64, (k % 300 + 1) * MS, false), 60);
            }
            if shard.table.num_buckets() != slots {
                slots = shard.table.num_buckets();
                rebuilt += 1;
                check(&shard);
            } else {
                let after: Vec<_> = (0..k).step_by(97).map(|j| shard.find(key(j))).collect();
                assert_eq!(before, after, "no counter moved without a rebuild");
            }
        }
        assert!(rebuilt > 5, "{rebuilt} rebuilds");
        check(&shard);
        for k in 0..5_000u64 {
            assert_eq!(shard.get(shard.find(key(k)).unwrap()).count, k as i64);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Hundreds of keys inserted and removed at random, the table
        /// rebuilt as it grows and shrinks: the lists stay whole.
        #[test]
        fn stays_whole_across_rebuilds(ops in prop::collection::vec((0u128..700, any::<bool>()), 1..3_000)) {
            let mut shard = Shard::new();
            let mut held = std::collections::HashSet::new();
            for (n, (k, add)) in ops.into_iter().enumerate() {
                let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
                match (add, shard.find(key)) {
                    (true, None) => {
                        shard.insert(key, counter(k as i64, (k as u64 + 1) * MS, k % 3 == 0), 60_000);
                        held.insert(key);
                    }
                    (false, Some(id)) => {
                        shard.remove(id);
                        held.remove(&key);
                    }
                    _ => {}
                }
                if n % 100 == 0 {
                    check(&shard);
                }
            }
            check(&shard);
            prop_assert_eq!(shard.len(), held.len());
            if held.len() < 100 {
                shard.shrink();
                check(&shard);
            }
        }
    }

    proptest! {
        /// The shard must agree with a HashMap through inserts, new windows,
        /// removals and sweeps, its index and lists staying whole.
        #[test]
        fn agrees_with_a_hash_map(
            ops in prop::collection::vec((0u128..40, 0u8..5, 1u64..5_000, any::<bool>()), 1..300)
        ) {
            let mut shard = Shard::new();
            let mut model: HashMap<KeyHash, Counter> = HashMap::new();
            let mut now = 0;
            for (k, op, window_ms, long) in ops {
                let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
                now += 100 * MS;
                let c = counter(k as i64, now + window_ms * MS, long);
                match (op, shard.find(key)) {
                    (0, Some(id)) => {
                        shard.remove(id);
                        model.remove(&key);
                    }
                    (1, _) => {
                        let dropped = shard.drop_ended(now, usize::MAX);
                        let gone: Vec<KeyHash> =
                            model.keys().filter(|k| shard.find(**k).is_none()).copied().collect();
                        prop_assert_eq!(gone.len(), dropped);
                        for k in gone {
                            prop_assert!(model.remove(&k).unwrap().reset_ms(now).is_none());
                        }
                        // Nothing is left in a bucket that has ended.
                        for e in shard.table.iter() {
                            prop_assert!(bucket_span(e.bucket()).1 > now);
                        }
                    }
                    (_, Some(id)) => {
                        shard.put(id, c, window_ms);
                        model.insert(key, c);
                    }
                    (_, None) => {
                        shard.insert(key, c, window_ms);
                        model.insert(key, c);
                    }
                }
                check(&shard);
                prop_assert_eq!(shard.len(), model.len());
                for (&key, &c) in &model {
                    prop_assert_eq!(shard.find(key).map(|id| shard.get(id)), Some(c));
                }
                for long in [false, true] {
                    let none = !model.values().any(|c| c.long == long);
                    prop_assert_eq!(shard.first(long) == u64::MAX, none);
                }
            }
        }
    }
}
