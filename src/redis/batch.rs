//! The side of a store that JavaScript drives. A hit is queued to the
//! runtime thread without waiting; finished hits are collected and handed
//! back in batches, with one wake-up of each thread per batch rather than
//! one per hit (see "How a hit travels" in the README).

use std::mem;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures_util::FutureExt;
use tokio::sync::{mpsc, Notify};

use super::config::{Config, Options};
use super::runtime;
use super::store::{Hit, Query, Store};
use crate::errors::{Error, Result};

pub struct Completion {
    pub id: u32,
    pub result: Result<Hit>,
}

/// A list that two threads share: one adds, the other takes it all. `wake`
/// is called when it stops being empty.
struct Shared<T> {
    list: Mutex<T>,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl<T: Default> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, T> {
        // Every change leaves the list whole, so a poisoned lock is still usable.
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, is_empty: impl Fn(&T) -> bool, add: impl FnOnce(&mut T)) {
        let first = {
            let mut list = self.lock();
            let was_empty = is_empty(&list);
            add(&mut list);
            was_empty && !is_empty(&list)
        };
        if first {
            (self.wake)();
        }
    }

    fn take(&self, into: &mut T) {
        mem::swap(&mut *self.lock(), into);
    }
}

/// Hits queued for the runtime: their keys side by side in one buffer.
#[derive(Default)]
struct Outbox {
    keys: Vec<u8>,
    hits: Vec<Queued>,
    closing: bool,
}

struct Queued {
    id: u32,
    key_end: usize,
    window_ms: u64,
    amount: i64,
}

impl Outbox {
    fn is_idle(&self) -> bool {
        self.hits.is_empty() && !self.closing
    }
}

struct Open {
    outbox: Arc<Shared<Outbox>>,
}

pub struct Batched {
    options: Options,
    open: OnceLock<Result<Open>>,
    closed: AtomicBool,
    done: Arc<Shared<Vec<Completion>>>,
}

impl Batched {
    /// A store that reads its environment and starts its I/O only on
    /// [`Batched::open`]; `wake` asks the JS thread to [`Batched::take`].
    pub fn new(options: Options, wake: Box<dyn Fn() + Send + Sync>) -> Batched {
        Batched {
            options,
            open: OnceLock::new(),
            closed: AtomicBool::new(false),
            done: Arc::new(Shared {
                list: Mutex::default(),
                wake,
            }),
        }
    }

    /// Resolves the settings against the environment that `env` reads, once.
    /// A settings error is kept: every hit rejects with it.
    pub fn open(&self, env: impl Fn(&str) -> Option<String>) {
        if self.closed.load(Ordering::Relaxed) {
            return; // Nothing to start for a store that is already closed.
        }
        self.open.get_or_init(|| {
            let config = Config::resolve(&self.options, env)?;
            let store = Store::new(&config)?;
            let runtime = runtime::handle()?;
            let ready = Arc::new(Notify::new());
            let notify = Arc::clone(&ready);
            let outbox = Arc::new(Shared {
                list: Mutex::default(),
                wake: Box::new(move || notify.notify_one()),
            });
            runtime.spawn(dispatch(
                Arc::clone(&outbox),
                ready,
                store,
                Arc::clone(&self.done),
            ));
            Ok(Open { outbox })
        });
    }

    /// Queues a hit on the counter at the prefix + `key`; its result comes
    /// back through [`Batched::take`] under `id`.
    pub fn send(&self, id: u32, key: &[u8], window_ms: u64, amount: i64) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let open = match self.open.get() {
            Some(Ok(open)) => open,
            Some(Err(e)) => return Err(e.clone()),
            None => {
                return Err(Error::Internal(
                    "a hit was sent before the store was opened",
                ))
            }
        };
        let prefix = self.options.prefix().as_bytes();
        open.outbox.add(Outbox::is_idle, |outbox| {
            outbox.keys.extend_from_slice(prefix);
            outbox.keys.extend_from_slice(key);
            outbox.hits.push(Queued {
                id,
                key_end: outbox.keys.len(),
                window_ms,
                amount,
            });
        });
        Ok(())
    }

    /// Swaps the finished hits into `into` (which should be empty), keeping
    /// both lists' memory for the next batch.
    pub fn take(&self, into: &mut Vec<Completion>) {
        self.done.take(into);
    }

    /// Refuses later hits and ends the connection once the hits sent before
    /// have settled.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(Ok(open)) = self.open.get() {
            open.outbox
                .add(Outbox::is_idle, |outbox| outbox.closing = true);
        }
    }
}

impl Drop for Batched {
    fn drop(&mut self) {
        // A store nobody holds any more closes too.
        self.close();
    }
}

/// Sends the queued hits, all that are waiting at once as one batch; on
/// close waits for the hits sent so far, then closes the connection.
async fn dispatch(
    outbox: Arc<Shared<Outbox>>,
    ready: Arc<Notify>,
    store: Store,
    done: Arc<Shared<Vec<Completion>>>,
) {
    let store = Arc::new(store);
    // Every batch holds a sender: `settled` ends once all of them have finished.
    let (in_flight, mut settled) = mpsc::channel::<()>(1);
    let mut closing = false;
    while !closing {
        ready.notified().await;
        let mut taken = Outbox::default();
        outbox.take(&mut taken);
        closing = taken.closing;
        if !taken.hits.is_empty() {
            let (store, done, guard) = (Arc::clone(&store), Arc::clone(&done), in_flight.clone());
            tokio::spawn(batch(store, done, taken, guard));
        }
    }
    drop(in_flight);
    let _ = settled.recv().await;
    store.close();
}

async fn batch(
    store: Arc<Store>,
    done: Arc<Shared<Vec<Completion>>>,
    outbox: Outbox,
    _in_flight: mpsc::Sender<()>,
) {
    let mut start = 0;
    let queries: Vec<Query> = outbox
        .hits
        .iter()
        .map(|hit| {
            let key = &outbox.keys[mem::replace(&mut start, hit.key_end)..hit.key_end];
            Query {
                key,
                window_ms: hit.window_ms,
                amount: hit.amount,
            }
        })
        .collect();
    let results = AssertUnwindSafe(store.hits(&queries))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| vec![Err(Error::Internal("a Rust panic was caught")); queries.len()]);
    let completions = outbox
        .hits
        .iter()
        .zip(results)
        .map(|(hit, result)| Completion { id: hit.id, result });
    done.add(Vec::is_empty, |list| list.extend(completions));
}
