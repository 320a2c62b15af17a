//! Keeps a store's calls on one key in the order they were made where
//! requests can overtake each other: over Upstash's REST API (each pipeline
//! is an HTTP request of its own, on whichever pooled connection is free),
//! and in a Redis Cluster (a pipeline that holds an UNLINK or a retry back
//! while a later pipeline goes on the same connection). A pipeline takes a
//! turn naming its keys, and waits until no turn taken before it names one
//! of them; pipelines on other keys go at once.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

struct Turn {
    id: u64,
    /// The keys' hashes: two keys with one hash only wait for each other.
    keys: HashSet<u64>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Turns {
    next: u64,
    queue: Vec<Turn>,
}

#[derive(Default)]
pub struct KeyOrder {
    turns: Mutex<Turns>,
}

/// A pipeline's turn: held while it is under way, its retries included.
pub struct Held<'a> {
    order: &'a KeyOrder,
    id: u64,
}

impl KeyOrder {
    fn lock(&self) -> MutexGuard<'_, Turns> {
        // Every change leaves the queue whole, so a poisoned lock is still usable.
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no earlier turn names one of `keys`.
    pub async fn turn<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Held<'_> {
        let keys: HashSet<u64> = keys
            .map(|key| {
                let mut h = DefaultHasher::new();
                key.hash(&mut h);
                h.finish()
            })
            .collect();
        let wake = Arc::new(Notify::new());
        let id = {
            let mut turns = self.lock();
            turns.next += 1;
            let id = turns.next;
            turns.queue.push(Turn {
                id,
                keys,
                wake: Arc::clone(&wake),
            });
            id
        };
        // Dropped while waiting (the hit gave up), the turn is taken out.
        let held = Held { order: self, id };
        while self.blocked(id) {
            wake.notified().await;
        }
        held
    }

    fn blocked(&self, id: u64) -> bool {
        let turns = self.lock();
        let Some(at) = turns.queue.iter().position(|t| t.id == id) else {
            return false;
        };
        let mine = &turns.queue[at].keys;
        turns.queue[..at].iter().any(|t| !t.keys.is_disjoint(mine))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut turns = self.order.lock();
        turns.queue.retain(|t| t.id != self.id);
        // Each waiting turn looks again (a stored permit if it is not waiting yet).
        for t in &turns.queue {
            t.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn a_turn_waits_only_for_earlier_turns_on_its_keys() {
        let order = KeyOrder::default();
        let a = order.turn([&b"k"[..]].into_iter()).now_or_never().unwrap();
        let mut b = Box::pin(order.turn([&b"k"[..], b"j"].into_iter()));
        assert!((&mut b).now_or_never().is_none(), "k is taken");
        let c = order.turn([&b"x"[..]].into_iter()).now_or_never();
        assert!(c.is_some(), "another key goes at once");
        let mut d = Box::pin(order.turn([&b"j"[..]].into_iter()));
        assert!((&mut d).now_or_never().is_none(), "j waits behind b");
        drop(a);
        let b = b.now_or_never().unwrap();
        assert!((&mut d).now_or_never().is_none());
        drop(b);
        assert!(d.now_or_never().is_some());
    }
}
