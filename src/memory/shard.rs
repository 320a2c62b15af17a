//! One shard of the memory table: an open-addressing hash table with linear
//! probing. A slot holds the key beside its counter, so a hit touches one
//! cache line. Shards grow by half, not double: a table of a million
//! counters has a third fewer empty slots than with powers of two.

use super::KeyHash;
use crate::window::Counter;

/// Slots in a new or fully shrunk shard.
const MIN_SLOTS: usize = 16;
/// The most slots in use, in eighths: below 3/4 linear probes stay short.
const MAX_LOAD_EIGHTHS: usize = 6;

const LONG_BIT: u64 = 1 << 63;

/// A key and its counter in 32 bytes: the count, and the window's end with
/// the "long window" flag in its top bit. A window always ends after time 0,
/// so an end of 0 marks an empty slot.
#[derive(Clone, Copy)]
pub struct Slot {
    key: KeyHash,
    count: i64,
    ends_at_long: u64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: 0,
        count: 0,
        ends_at_long: 0,
    };

    pub fn new(key: KeyHash, c: Counter) -> Slot {
        debug_assert!(c.ends_at > 0, "a window ends after time 0");
        let ends_at = c.ends_at.min(LONG_BIT - 1);
        Slot {
            key,
            count: c.count,
            ends_at_long: ends_at | if c.long { LONG_BIT } else { 0 },
        }
    }

    pub fn key(&self) -> KeyHash {
        self.key
    }

    pub fn counter(&self) -> Counter {
        Counter {
            count: self.count,
            ends_at: self.ends_at_long & !LONG_BIT,
            long: self.ends_at_long & LONG_BIT != 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.ends_at_long == 0
    }
}

/// Where a key was looked for.
pub enum Found {
    /// Its slot.
    At(usize),
    /// Not held; this empty slot is where it would go.
    Vacant(usize),
}

pub struct Shard {
    /// At least one slot is always empty, which ends every probe.
    slots: Vec<Slot>,
    held: usize,
    /// The latest time a hit here was applied at: time per key never runs back.
    now: u64,
}

/// The key's home slot among `len`: its low 64 bits scaled to the length
/// (the shard was chosen by its high bits).
fn home(key: KeyHash, len: usize) -> usize {
    ((key as u64 as u128 * len as u128) >> 64) as usize
}

/// The slot after `i`, wrapping around.
fn next(i: usize, len: usize) -> usize {
    if i + 1 == len {
        0
    } else {
        i + 1
    }
}

/// How many steps forward from `from` to `to`, wrapping around.
fn distance(from: usize, to: usize, len: usize) -> usize {
    if to >= from {
        to - from
    } else {
        to + len - from
    }
}

impl Shard {
    pub fn new() -> Shard {
        Shard {
            slots: vec![Slot::EMPTY; MIN_SLOTS],
            held: 0,
            now: 0,
        }
    }

    /// The time to apply a hit at: `now`, or the latest time applied here if
    /// that is later.
    pub fn tick(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    pub fn find(&self, key: KeyHash) -> Found {
        let len = self.slots.len();
        let mut i = home(key, len);
        loop {
            let slot = &self.slots[i];
            if slot.is_empty() {
                return Found::Vacant(i);
            }
            if slot.key == key {
                return Found::At(i);
            }
            i = next(i, len);
        }
    }

    pub fn get(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    pub fn set(&mut self, i: usize, slot: Slot) {
        debug_assert!(!self.slots[i].is_empty());
        self.slots[i] = slot;
    }

    /// Puts a key that is not held; `vacant` is where `find` said it would go.
    pub fn insert(&mut self, vacant: usize, slot: Slot) {
        let grow = (self.held + 1) * 8 > self.slots.len() * MAX_LOAD_EIGHTHS;
        let at = if grow {
            self.resize(self.slots.len() * 3 / 2);
            match self.find(slot.key) {
                Found::Vacant(i) => i,
                Found::At(_) => unreachable!("insert is only called for a key not held"),
            }
        } else {
            vacant
        };
        self.slots[at] = slot;
        self.held += 1;
    }

    /// Empties slot `i`, moving later slots of its probe run back so that
    /// every key stays reachable from its home (no tombstones).
    pub fn remove(&mut self, mut i: usize) {
        let len = self.slots.len();
        let mut j = i;
        loop {
            j = next(j, len);
            if self.slots[j].is_empty() {
                break;
            }
            // The key at j may fill the hole at i if its home is not after i.
            let from_home = distance(home(self.slots[j].key, len), j, len);
            if from_home >= distance(i, j, len) {
                self.slots[i] = self.slots[j];
                i = j;
            }
        }
        self.slots[i] = Slot::EMPTY;
        self.held -= 1;
    }

    /// Empties every slot for which `keep` is false; returns how many.
    pub fn retain(&mut self, mut keep: impl FnMut(&Slot) -> bool) -> usize {
        let before = self.held;
        let mut i = 0;
        // A removal may move a later slot into i (or, across the end, a slot
        // seen already to the end): look at i again rather than step over it.
        while i < self.slots.len() {
            if !self.slots[i].is_empty() && !keep(&self.slots[i]) {
                self.remove(i);
            } else {
                i += 1;
            }
        }
        before - self.held
    }

    /// Gives memory back once the shard is mostly empty. Returns true when
    /// it did.
    pub fn shrink(&mut self) -> bool {
        // Half full after shrinking, so that it doesn't grow again soon.
        let fit = (self.held * 2).max(MIN_SLOTS);
        if fit * 4 > self.slots.len() {
            return false;
        }
        self.resize(fit);
        true
    }

    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| !s.is_empty())
    }

    fn resize(&mut self, len: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::EMPTY; len]);
        for slot in old.into_iter().filter(|s| !s.is_empty()) {
            let mut i = home(slot.key, len);
            while !self.slots[i].is_empty() {
                i = next(i, len);
            }
            self.slots[i] = slot;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn counter(count: i64) -> Counter {
        Counter {
            count,
            ends_at: 1_000,
            long: false,
        }
    }

    fn put(shard: &mut Shard, key: KeyHash, count: i64) {
        match shard.find(key) {
            Found::At(i) => shard.set(i, Slot::new(key, counter(count))),
            Found::Vacant(i) => shard.insert(i, Slot::new(key, counter(count))),
        }
    }

    fn get(shard: &Shard, key: KeyHash) -> Option<i64> {
        match shard.find(key) {
            Found::At(i) => Some(shard.get(i).counter().count),
            Found::Vacant(_) => None,
        }
    }

    #[test]
    fn slots_are_thirty_two_bytes_and_round_trip() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        let c = Counter {
            count: -crate::window::MAX_SAFE,
            ends_at: 123,
            long: true,
        };
        assert_eq!(Slot::new(9, c).counter(), c);
        assert_eq!(Slot::new(9, c).key(), 9);
    }

    #[test]
    fn crowded_keys_share_homes_near_the_end() {
        assert_eq!(home(crowded(0), MIN_SLOTS), 13);
        assert_eq!(home(crowded(3), MIN_SLOTS), 0);
        assert_eq!(home(crowded(5), MIN_SLOTS), 13);
    }

    #[test]
    fn grows_and_shrinks() {
        let mut shard = Shard::new();
        for key in 0..1_000u128 {
            put(
                &mut shard,
                key.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
                key as i64,
            );
        }
        assert_eq!(shard.held, 1_000);
        assert!(shard.slots.len() * MAX_LOAD_EIGHTHS >= 1_000 * 8);
        assert!(shard.slots.len() * MAX_LOAD_EIGHTHS < 1_000 * 8 * 3 / 2);
        assert_eq!(shard.retain(|s| s.counter().count < 10), 990);
        assert!(shard.shrink());
        assert_eq!(shard.slots.len(), 20, "half full after shrinking");
        for key in 0..1_000u128 {
            let want = (key < 10).then_some(key as i64);
            let hashed = key.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
            assert_eq!(get(&shard, hashed), want, "key {key}");
        }
    }

    /// Key `k` of a few crowded homes near the end of 16 slots (13, 14, 15,
    /// 0 and 1), so that probe runs wrap around and removals shift them back.
    fn crowded(k: u128) -> KeyHash {
        (((k % 5 + 13) % 16) << 60) | k
    }

    proptest! {
        /// The shard must agree with a HashMap through puts, removals and retains.
        #[test]
        fn agrees_with_a_hash_map(
            ops in prop::collection::vec((0u128..40, 0u8..4, -3i64..4), 1..400)
        ) {
            let mut shard = Shard::new();
            let mut model = HashMap::new();
            for (k, op, count) in ops {
                let key = crowded(k);
                match op {
                    0 => {
                        if let Found::At(i) = shard.find(key) {
                            shard.remove(i);
                        }
                        model.remove(&key);
                    }
                    1 => {
                        shard.retain(|s| s.counter().count != count);
                        model.retain(|_, c| *c != count);
                    }
                    _ => {
                        put(&mut shard, key, count);
                        model.insert(key, count);
                    }
                }
                prop_assert_eq!(shard.held, model.len());
                for k in 0..40u128 {
                    prop_assert_eq!(get(&shard, crowded(k)), model.get(&crowded(k)).copied());
                }
            }
        }
    }
}
