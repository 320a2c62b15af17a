//! One shard of the memory table. Its counters sit in a dense array, found by
//! key through an index of array positions, and kept in order of their ends
//! by an expiry index, so that what to sweep or evict is found without a scan:
//!
//! - A counter's end falls in a bucket 1/256 of its window long (windows are
//!   grouped by their power of two, so each group has its own bucket length).
//! - Each bucket is a list linked through the counters themselves (two `u32`
//!   positions each), in the order its counters were opened: for windows of
//!   one length, the order they end.
//! - Two ordered maps from a bucket's start to the head of its list, one for
//!   short windows (evicted when the table is full) and one for long ones
//!   (never evicted, only dropped once ended). Only buckets in use take room.
//!
//! A hit touches three cache lines: the shard's lock with the fields a hit
//! reads (one line, see [`Shard`]), the index's slot and the counter's 32
//! bytes; a fourth, the chunk's address, once the shard holds more than one
//! chunk. Links, the maps and the other counts sit apart.

use std::collections::BTreeMap;

use super::KeyHash;
use crate::errors::Result;
use crate::window::{self, Counter, Outcome};

/// Ends are kept to 2^56 µs (2,284 years) of the process clock, so that the
/// top byte of `Entry::end` holds the window's group and its long flag.
const END_MASK: u64 = (1 << 56) - 1;
const GROUP_SHIFT: u32 = 56;
const LONG_BIT: u64 = 1 << 63;
/// A bucket is 1/2^8 of the shortest window of its group.
const BUCKETS_PER_WINDOW_LOG2: u32 = 8;
/// Array positions are `u32`: a shard holds fewer than 2^32 counters.
const NONE: u32 = u32::MAX;

/// A key and its counter: what a hit reads and writes, 32 bytes aligned to
/// 32, so that it never straddles two cache lines.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Entry {
    /// The key hash, as two halves (a `u128` field would align the entry to 16 bytes).
    key: [u64; 2],
    count: i64,
    /// The window's end (µs, low 56 bits), its group (the window's length
    /// in µs, log 2, 6 bits) and, in the top bit, the long flag.
    end: u64,
}

/// An entry's place in its bucket's list: read only when its window is
/// replaced or it is dropped, so it is kept beside the entries, not in them.
#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

impl Entry {
    const UNUSED: Entry = Entry {
        key: [0; 2],
        count: 0,
        end: 0,
    };

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

/// 256 entries and their links (10 KiB) a chunk.
const CHUNK_LOG2: u32 = 8;
const CHUNK: usize = 1 << CHUNK_LOG2;

/// A fixed block of entries: a growing shard adds chunks, never copies
/// them, and leaves no freed block behind.
struct Chunk {
    entries: [Entry; CHUNK],
    links: [Link; CHUNK],
}

impl Chunk {
    fn new() -> Box<Chunk> {
        Box::new(Chunk {
            entries: [Entry::UNUSED; CHUNK],
            links: [Link {
                prev: NONE,
                next: NONE,
            }; CHUNK],
        })
    }
}

/// A shard's chunks: the first held in the shard itself, so that a shard of
/// up to 256 counters (any table of up to about 20,000) reads no table of
/// chunks on a hit; the rest in a table, reallocated as a chunk comes or goes
/// (every 256 counters), so that it takes 16 bytes of the shard's first line.
#[repr(C)]
#[derive(Default)]
struct Chunks {
    first: Option<Box<Chunk>>,
    rest: Box<[Box<Chunk>]>,
}

impl Chunks {
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    #[inline(always)]
    fn get(&self, c: usize) -> &Chunk {
        match c {
            0 => self.first.as_deref(),
            _ => self.rest.get(c - 1).map(|chunk| &**chunk),
        }
        .expect("a position held is in a chunk")
    }

    #[inline(always)]
    fn get_mut(&mut self, c: usize) -> &mut Chunk {
        match c {
            0 => self.first.as_deref_mut(),
            _ => self.rest.get_mut(c - 1).map(|chunk| &mut **chunk),
        }
        .expect("a position held is in a chunk")
    }

    fn push(&mut self) {
        if self.first.is_none() {
            self.first = Some(Chunk::new());
            return;
        }
        let mut rest = std::mem::take(&mut self.rest).into_vec();
        rest.push(Chunk::new());
        self.rest = rest.into_boxed_slice();
    }

    fn pop(&mut self) {
        if self.rest.is_empty() {
            self.first = None;
            return;
        }
        let mut rest = std::mem::take(&mut self.rest).into_vec();
        rest.pop();
        self.rest = rest.into_boxed_slice();
    }
}

/// Position `i`'s chunk, and its place in that chunk.
#[inline(always)]
fn in_chunk(i: u32) -> (usize, usize) {
    ((i >> CHUNK_LOG2) as usize, i as usize & (CHUNK - 1))
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

/// An index slot that holds nothing: a probe stops here.
const EMPTY: u32 = u32::MAX;
/// An index slot whose position was dropped: a probe goes on past it.
const TOMB: u32 = u32::MAX - 1;
/// The fewest slots an index that holds anything has.
const MIN_SLOTS: usize = 16;

/// Positions an index of `slots` slots may hold: 7/8 of them, so that a
/// probe that misses ends soon. With at least 16 slots, a position's low
/// bits are never those of `EMPTY` or `TOMB` (at most `slots - 3`).
fn room(slots: usize) -> usize {
    slots / 8 * 7
}

/// The fewest slots that hold `n` positions.
fn slots_for(n: usize) -> usize {
    let mut slots = MIN_SLOTS;
    while room(slots) < n {
        slots *= 2;
    }
    slots
}

/// Where a key's probe starts in an index of `mask + 1` slots, and the tag
/// its slot carries: the low half of the key hash splits into both (the
/// shard was chosen by the high half).
fn place(key: KeyHash, mask: usize) -> (usize, u32) {
    let low = key as u64;
    (low as usize & mask, (low >> 32) as u32 & !(mask as u32))
}

/// One shard. The index is hand-written open addressing over `u32` slots:
/// a slot is a position in its low bits and, above them, a tag from the key
/// hash, so a probe reads a counter only when the tag agrees. Probes are
/// linear (16 slots to a cache line); a dropped position leaves a tombstone,
/// cleared when the index is rebuilt from the entries (as it grows, or once
/// tombstones take the room). The counters never move for the index's sake.
///
/// `repr(C)`: the fields a hit reads come first, so that with the mutex's
/// word before them (the shard is the mutex's value, 8 bytes in, in a
/// 64-byte-aligned `Locked`) they share one cache line.
#[repr(C)]
#[derive(Default)]
pub struct Shard {
    /// Entries by position, a chunk at a time.
    chunks: Chunks,
    /// Positions in `chunks`, by key: empty, or a power of two (at least 16) of slots.
    slots: Box<[u32]>,
    /// The latest time a hit here was applied at: time per key never runs back.
    now: u64,
    /// What happened here, counted under the shard's lock (`calls` first: a hit counts it).
    pub tally: ShardTally,
    /// Entries held.
    len: u32,
    /// Tombstones in `slots`.
    tombs: u32,
    short: BTreeMap<u64, u32>,
    long: BTreeMap<u64, u32>,
}

/// A shard's counts of what it did: plain integers, changed only under its
/// lock, so counting costs a hit no shared cache line.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ShardTally {
    /// Calls that ran here (every op, a read included).
    pub calls: u64,
    /// Ended windows dropped to make room for a new counter.
    pub evicted_ended: u64,
    /// Short windows (at most one hour) dropped before their end to make room.
    pub evicted_short: u64,
    /// Ended windows the sweeper dropped.
    pub swept: u64,
}

impl ShardTally {
    pub fn add(&mut self, other: &ShardTally) {
        self.calls += other.calls;
        self.evicted_ended += other.evicted_ended;
        self.evicted_short += other.evicted_short;
        self.swept += other.swept;
    }
}

/// A counter held, by its position in the shard (valid until the next change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id(u32);

impl Shard {
    pub fn new() -> Shard {
        Shard::default()
    }

    /// Counters held.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// The time to apply a hit at: `now`, or the latest time applied here if
    /// that is later.
    #[inline]
    pub fn tick(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    #[inline(always)]
    fn entry(&self, i: u32) -> &Entry {
        let (c, at) = in_chunk(i);
        &self.chunks.get(c).entries[at]
    }

    #[inline(always)]
    fn entry_mut(&mut self, i: u32) -> &mut Entry {
        let (c, at) = in_chunk(i);
        &mut self.chunks.get_mut(c).entries[at]
    }

    fn link(&self, i: u32) -> Link {
        let (c, at) = in_chunk(i);
        self.chunks.get(c).links[at]
    }

    fn link_mut(&mut self, i: u32) -> &mut Link {
        let (c, at) = in_chunk(i);
        &mut self.chunks.get_mut(c).links[at]
    }

    #[inline]
    pub fn find(&self, key: KeyHash) -> Option<Id> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let (mut i, tag) = place(key, mask);
        let halves = [key as u64, (key >> 64) as u64];
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return None;
            }
            if (slot ^ tag) & !(mask as u32) == 0 && slot != TOMB {
                let at = slot & mask as u32;
                if self.entry(at).key == halves {
                    return Some(Id(at));
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// The index slot that holds position `at` of key `key`.
    fn slot_of(&self, key: KeyHash, at: u32) -> usize {
        let mask = self.slots.len() - 1;
        let (mut i, _) = place(key, mask);
        loop {
            let slot = self.slots[i];
            assert!(slot != EMPTY, "every entry is indexed");
            if slot & mask as u32 == at && slot != TOMB {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Indexes position `at` of key `key`, which the index does not hold
    /// and has room for.
    fn index(&mut self, key: KeyHash, at: u32) {
        let mask = self.slots.len() - 1;
        let (mut i, tag) = place(key, mask);
        while self.slots[i] < TOMB {
            i = (i + 1) & mask;
        }
        if self.slots[i] == TOMB {
            self.tombs -= 1;
        }
        self.slots[i] = tag | at;
    }

    /// Rebuilds the index with `slots` slots (none for an empty shard) from the entries: no tombstones.
    fn reindex(&mut self, slots: usize) {
        self.slots = vec![EMPTY; slots].into_boxed_slice();
        self.tombs = 0;
        for at in 0..self.len {
            self.index(self.entry(at).key(), at);
        }
    }

    /// Makes room in the index for `n` positions (tombstones count until
    /// cleared): rebuilt at the same size when at most half of its room is
    /// held, else twice as large.
    fn reserve(&mut self, n: usize) {
        let slots = self.slots.len();
        if n + self.tombs as usize <= room(slots) {
            return;
        }
        if n <= room(slots) / 2 {
            self.reindex(slots);
        } else {
            self.reindex(slots_for(n.max(room(slots) + 1)));
        }
    }

    /// The key held at `id`.
    pub fn key_of(&self, id: Id) -> KeyHash {
        self.entry(id.0).key()
    }

    #[inline]
    pub fn get(&self, id: Id) -> Counter {
        self.entry(id.0).counter()
    }

    /// A hit on the key at `id` if its window is open: the count changed in
    /// place, as [`window::hit`] would have it (an error changes nothing).
    /// `None`, having changed nothing, if the window has ended: the caller
    /// goes on with the same `id`.
    #[inline(always)]
    pub fn hit_open(&mut self, id: Id, now: u64, amount: i64) -> Option<Result<Outcome>> {
        let entry = self.entry_mut(id.0);
        let counter = entry.counter();
        let reset_ms = counter.reset_ms(now)?;
        Some(window::add(counter, reset_ms, amount).inspect(|o| entry.count = o.count))
    }

    /// Stores counter `c` for the key at `id`, opened with `window_ms` if it is
    /// a new window. Returns true when the expiry index changed.
    #[inline(always)]
    pub fn put(&mut self, id: Id, c: Counter, window_ms: u64) -> bool {
        let entry = self.entry_mut(id.0);
        entry.count = c.count;
        if c.ends_at.min(END_MASK) == entry.ends_at() && c.long == entry.long() {
            return false;
        }
        self.renew(id.0, packed_end(c, window_ms));
        true
    }

    /// Moves entry `i` to the bucket of its new end.
    #[inline(never)]
    fn renew(&mut self, i: u32, end: u64) {
        self.unlink(i);
        self.entry_mut(i).end = end;
        self.link_in(i);
    }

    /// Adds a key that is not held, with a window of `window_ms` just opened.
    pub fn insert(&mut self, key: KeyHash, c: Counter, window_ms: u64) {
        debug_assert!(self.find(key).is_none());
        let i = self.len;
        assert!(i < NONE - 1, "a shard holds fewer than 2^32 - 1 counters");
        self.reserve(i as usize + 1);
        // Every chunk before position i's is full; a spare may follow it.
        if (i >> CHUNK_LOG2) as usize == self.chunks.len() {
            self.chunks.push();
        }
        *self.entry_mut(i) = Entry {
            key: [key as u64, (key >> 64) as u64],
            count: c.count,
            end: packed_end(c, window_ms),
        };
        self.len += 1;
        self.index(key, i);
        self.link_in(i);
    }

    /// Drops the counter at `id`. The last entry moves into its place.
    pub fn remove(&mut self, id: Id) {
        let i = id.0;
        self.unlink(i);
        let key = self.entry(i).key();
        let at = self.slot_of(key, i);
        let mask = self.slots.len() - 1;
        if self.slots[(at + 1) & mask] == EMPTY {
            // The end of a probe run: empty it, and the tombstones before it.
            self.slots[at] = EMPTY;
            let mut j = at.wrapping_sub(1) & mask;
            while self.slots[j] == TOMB {
                self.slots[j] = EMPTY;
                self.tombs -= 1;
                j = j.wrapping_sub(1) & mask;
            }
        } else {
            self.slots[at] = TOMB;
            self.tombs += 1;
        }
        let last = self.len - 1;
        self.len = last;
        if i != last {
            // The entry that was last moves to i: repoint its index slot and its list.
            let (moved, link) = (*self.entry(last), self.link(last));
            *self.entry_mut(i) = moved;
            *self.link_mut(i) = link;
            let at = self.slot_of(moved.key(), last);
            self.slots[at] = self.slots[at] & !(mask as u32) | i;
            if link.prev == last {
                // Alone in its list.
                *self.link_mut(i) = Link { prev: i, next: i };
            } else {
                self.link_mut(link.prev).next = i;
                self.link_mut(link.next).prev = i;
            }
            let head = self
                .map(moved.long())
                .get_mut(&moved.bucket())
                .expect("every entry is listed");
            if *head == last {
                *head = i;
            }
        }
        // One emptied chunk stays as a spare, so that a shard whose size
        // wavers across a chunk's edge does not allocate and free one on every hit.
        if self.chunks.len() > (self.len as usize).div_ceil(CHUNK) + 1 {
            self.chunks.pop();
        }
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

    /// Gives its index's memory back once the shard is mostly empty (its
    /// entries give theirs back chunk by chunk). Returns true when it did.
    pub fn shrink(&mut self) -> bool {
        let n = self.len();
        // Half full after shrinking, so that it doesn't grow again soon.
        if n * 4 > room(self.slots.len()).max(MIN_SLOTS) {
            return false;
        }
        self.reindex(if n == 0 { 0 } else { slots_for(n * 2) });
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
    fn link_in(&mut self, i: u32) {
        let (bucket, long) = (self.entry(i).bucket(), self.entry(i).long());
        match self.map(long).get(&bucket).copied() {
            None => {
                self.map(long).insert(bucket, i);
                *self.link_mut(i) = Link { prev: i, next: i };
            }
            Some(head) => {
                // The list is a ring: the head's prev is its tail.
                let tail = self.link(head).prev;
                self.link_mut(tail).next = i;
                self.link_mut(head).prev = i;
                *self.link_mut(i) = Link {
                    prev: tail,
                    next: head,
                };
            }
        }
    }

    /// Takes entry `i` out of its bucket's list, dropping the bucket if it empties.
    fn unlink(&mut self, i: u32) {
        let Link { prev, next } = self.link(i);
        let (bucket, long) = (self.entry(i).bucket(), self.entry(i).long());
        if next == i {
            self.map(long).remove(&bucket);
            return;
        }
        self.link_mut(prev).next = next;
        self.link_mut(next).prev = prev;
        let head = self
            .map(long)
            .get_mut(&bucket)
            .expect("every entry is listed");
        if *head == i {
            *head = next;
        }
    }

    /// The entries held, in order of position (tests).
    #[cfg(test)]
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        (0..self.len).map(|i| self.entry(i))
    }

    /// Positions the index holds (tests).
    #[cfg(test)]
    fn indexed(&self) -> usize {
        self.slots.iter().filter(|&&s| s < TOMB).count()
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
        assert_eq!(shard.indexed(), shard.len());
        assert!(shard.len() + shard.tombs as usize <= room(shard.slots.len()));
        assert_eq!(
            shard.slots.iter().filter(|&&s| s == TOMB).count(),
            shard.tombs as usize
        );
        let mut listed = 0;
        for long in [false, true] {
            for (&bucket, &head) in shard.map_ref(long) {
                let (start, end) = bucket_span(bucket);
                let mut i = head;
                loop {
                    let (e, link) = (shard.entry(i), shard.link(i));
                    assert_eq!(e.bucket(), bucket);
                    assert_eq!(e.long(), long);
                    assert!((start..end).contains(&e.ends_at()));
                    assert_eq!(shard.link(link.next).prev, i);
                    assert_eq!(shard.find(e.key()), Some(Id(i)));
                    listed += 1;
                    i = link.next;
                    if i == head {
                        break;
                    }
                }
            }
        }
        assert_eq!(listed, shard.len());
    }

    #[test]
    fn entries_are_thirty_two_aligned_bytes_and_round_trip() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        assert_eq!(std::mem::align_of::<Entry>(), 32);
        assert_eq!(std::mem::size_of::<Link>(), 8);
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
        assert_eq!(shard.get(Id(0)).ends_at, END_MASK);
        // It ends with the ms tick it ends in.
        let tick = END_MASK / 1_000 * 1_000;
        assert_eq!(shard.drop_ended(tick - 1, 10), 0);
        assert_eq!(shard.drop_ended(tick, 10), 1);
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
        assert!(room(shard.slots.len()) < 4_000);
        // Its chunks, and at most one spare.
        let chunks = shard.chunks.len();
        assert!(
            (0..=1).contains(&(chunks - 1_000usize.div_ceil(CHUNK))),
            "{chunks} chunks"
        );
        check(&shard);
        for k in 0..10_000u128 {
            let held = shard.find(k << 64 | k).map(|id| shard.get(id).count);
            assert_eq!(held, (k % 50 >= 45).then_some(k as i64), "key {k}");
        }
    }

    #[test]
    fn turning_over_at_one_size_clears_tombstones_without_growing() {
        // 1,000 counters held while 50,000 come and go: every drop leaves a
        // tombstone or an empty slot, and the index is rebuilt, not grown.
        let mut shard = Shard::new();
        let key = |k: u64| (k as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        for k in 0..1_000u64 {
            shard.insert(key(k), counter(k as i64, (k + 1) * MS, false), 60);
        }
        let slots = shard.slots.len();
        for k in 1_000..51_000u64 {
            let oldest = shard.find(key(k - 1_000)).expect("held");
            shard.remove(oldest);
            shard.insert(key(k), counter(k as i64, (k + 1) * MS, false), 60);
            if k % 5_000 == 0 {
                check(&shard);
            }
        }
        // Grown once at most (as hashbrown does, an index more than half full
        // grows rather than rebuild in place), then rebuilt at its size.
        assert!(
            shard.slots.len() <= 2 * slots,
            "{} slots",
            shard.slots.len()
        );
        for k in 50_000..51_000u64 {
            assert_eq!(shard.get(shard.find(key(k)).unwrap()).count, k as i64);
        }
        assert_eq!(shard.find(key(49_999)), None);
    }

    #[test]
    fn a_size_wavering_across_a_chunk_edge_keeps_one_spare() {
        let mut shard = Shard::new();
        let key = |k: u64| (k as u128 + 1) << 64 | k as u128;
        for k in 0..CHUNK as u64 {
            shard.insert(key(k), counter(k as i64, (k + 1) * MS, false), 60);
        }
        for round in 0..4u64 {
            let k = CHUNK as u64 + round;
            shard.insert(key(k), counter(k as i64, MS, false), 60);
            shard.insert(key(k + 100), counter(0, 2 * MS, false), 60);
            assert_eq!(shard.chunks.len(), 2);
            for gone in [k, k + 100, round] {
                shard.remove(shard.find(key(gone)).unwrap());
                check(&shard);
            }
            assert_eq!(shard.chunks.len(), 2, "the spare stays");
            shard.insert(
                key(round),
                counter(round as i64, (round + 1) * MS, false),
                60,
            );
        }
        for k in 0..CHUNK as u64 {
            assert_eq!(shard.get(shard.find(key(k)).unwrap()).count, k as i64);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Hundreds of keys inserted and removed at random: positions move
        /// across chunk edges, and the index and lists stay whole.
        #[test]
        fn stays_whole_across_chunks(ops in prop::collection::vec((0u128..700, any::<bool>()), 1..3_000)) {
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
            prop_assert!(shard.chunks.len() <= held.len().div_ceil(CHUNK) + 1);
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
                        for e in shard.entries() {
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
