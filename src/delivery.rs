//! How finished calls go back to JavaScript from a store that runs on the
//! I/O thread (redisStore's `batch`, postgresStore): each finished call is
//! a [`Completion`]; a [`Delivery`] collects them, with the connections'
//! events, and wakes the JS thread once per batch (when its list goes from
//! empty to not), which then takes them all at once. No Node-API here: the
//! binding's wake-up is a closure. Connection events ([`Event`]) travel
//! with the calls, so that `onError` hears them in order with the results.

use std::mem;
use std::sync::{Mutex, MutexGuard};

use crate::errors::Result;
use crate::ops::Answer;

/// A change of a connection's state, as `onError` receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The first connection is open.
    Connected,
    /// An open connection failed, with the code its calls rejected with.
    Lost(&'static str),
    /// A connection is open again after a loss.
    Reconnected,
}

impl Event {
    pub fn kind(self) -> &'static str {
        match self {
            Event::Connected => "connected",
            Event::Lost(_) => "lost",
            Event::Reconnected => "reconnected",
        }
    }
}

/// Where connection events go: a store that listens to a [`Monitor`].
pub trait Listener: Send + Sync {
    fn tell(&self, event: Event);
}

/// A finished call: its id (the JS side's slot) and its result.
pub struct Completion {
    pub id: u32,
    pub result: Result<Answer>,
}

/// A list that two threads share: one adds, the other takes it all. `add`
/// says whether the taker must be woken.
pub struct Shared<T> {
    list: Mutex<T>,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl<T: Default> Shared<T> {
    pub fn new(wake: Box<dyn Fn() + Send + Sync>) -> Shared<T> {
        Shared {
            list: Mutex::default(),
            wake,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        // Every change leaves the list whole, so a poisoned lock is still usable.
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add(&self, add: impl FnOnce(&mut T) -> bool) {
        let wake = add(&mut self.lock());
        if wake {
            (self.wake)();
        }
    }
}

/// What goes back to JavaScript: finished calls, and connection events.
#[derive(Default)]
pub struct Finished {
    completions: Vec<Completion>,
    events: Vec<Event>,
}

impl Finished {
    fn is_empty(&self) -> bool {
        self.completions.is_empty() && self.events.is_empty()
    }
}

/// A store's finished calls on their way to the JS thread.
pub struct Delivery(Shared<Finished>);

impl Delivery {
    /// `wake` asks the JS thread to [`Delivery::take`]; it runs once per
    /// batch, from whichever thread finished the batch's first call.
    pub fn new(wake: Box<dyn Fn() + Send + Sync>) -> Delivery {
        Delivery(Shared::new(wake))
    }

    pub fn push(&self, completion: Completion) {
        self.push_all([completion]);
    }

    pub fn push_all(&self, items: impl IntoIterator<Item = Completion>) {
        self.0.add(|list| {
            let was_empty = list.is_empty();
            list.completions.extend(items);
            was_empty && !list.is_empty()
        });
    }

    /// Swaps the finished calls and the connection events since the last
    /// take into `completions` and `events` (which should be empty),
    /// keeping the lists' memory for the next batch.
    pub fn take(&self, completions: &mut Vec<Completion>, events: &mut Vec<Event>) {
        let mut list = self.0.lock();
        mem::swap(&mut list.completions, completions);
        mem::swap(&mut list.events, events);
    }
}

impl Listener for Delivery {
    fn tell(&self, event: Event) {
        self.0.add(|list| {
            let was_empty = list.is_empty();
            list.events.push(event);
            was_empty
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn one_wake_up_per_batch_until_it_is_taken() {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let delivery = Delivery::new(Box::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        let done = |id| Completion {
            id,
            result: Err(crate::errors::Error::Closed),
        };
        delivery.push(done(1));
        delivery.push_all([done(2), done(3)]);
        delivery.tell(Event::Connected);
        assert_eq!(wakes.load(Ordering::Relaxed), 1);
        let (mut completions, mut events) = (Vec::new(), Vec::new());
        delivery.take(&mut completions, &mut events);
        let ids: Vec<u32> = completions.iter().map(|c| c.id).collect();
        assert_eq!((ids, events.len()), (vec![1, 2, 3], 1));
        delivery.push_all([]);
        assert_eq!(
            wakes.load(Ordering::Relaxed),
            1,
            "nothing added: no wake-up"
        );
        delivery.push(done(4));
        assert_eq!(wakes.load(Ordering::Relaxed), 2);
    }
}
