//! The side of a store that JavaScript drives. A hit is queued to the
//! runtime thread without waiting; finished hits are collected and handed
//! back in batches, with one wake-up of the JS thread per batch rather than
//! one per hit (see "How a hit travels" in the README).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures_util::FutureExt;
use tokio::sync::mpsc::{self, unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::config::{Config, Options};
use super::runtime;
use super::store::{Hit, Query, Store};
use crate::errors::{Error, Result};

/// Requests the dispatcher takes off the queue at once.
const DISPATCH_BATCH: usize = 1024;

/// A hit as JavaScript sent it; `id` tells its promise.
pub struct Request {
    pub id: u32,
    pub query: Query,
}

/// What the queue to the runtime carries.
enum Message {
    Hit(Request),
    /// Sent by `close()`, after every hit it must still let settle.
    Close,
}

pub struct Completion {
    pub id: u32,
    pub result: Result<Hit>,
}

/// Finished hits waiting for the JS thread.
struct Done {
    list: Mutex<Vec<Completion>>,
    /// Asks the JS thread to take the list; called when it stops being empty.
    wake: Box<dyn Fn() + Send + Sync>,
}

impl Done {
    fn lock(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, completions: impl Iterator<Item = Completion>) {
        let first = {
            let mut list = self.lock();
            let was_empty = list.is_empty();
            list.extend(completions);
            was_empty && !list.is_empty()
        };
        if first {
            (self.wake)();
        }
    }
}

struct Open {
    queue: UnboundedSender<Message>,
}

pub struct Batched {
    options: Options,
    open: OnceLock<Result<Open>>,
    closed: AtomicBool,
    done: Arc<Done>,
}

impl Batched {
    /// A store that reads its environment and starts its I/O only on [`Batched::open`].
    pub fn new(options: Options, wake: Box<dyn Fn() + Send + Sync>) -> Batched {
        Batched {
            options,
            open: OnceLock::new(),
            closed: AtomicBool::new(false),
            done: Arc::new(Done {
                list: Mutex::default(),
                wake,
            }),
        }
    }

    /// Prepended to every key.
    pub fn prefix(&self) -> &[u8] {
        self.options.prefix().as_bytes()
    }

    /// Resolves the settings against the environment that `env` reads, once.
    /// A settings error is kept: every hit rejects with it.
    pub fn open(&self, env: impl Fn(&str) -> Option<String>) {
        self.open.get_or_init(|| {
            let config = Config::resolve(&self.options, env)?;
            let store = Store::new(&config)?;
            let (queue, messages) = unbounded_channel();
            runtime::handle()?.spawn(dispatch(messages, store, Arc::clone(&self.done)));
            Ok(Open { queue })
        });
    }

    /// Queues a hit; its result comes back through [`Batched::take`].
    pub fn send(&self, request: Request) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        match self.open.get() {
            Some(Ok(open)) => open
                .queue
                .send(Message::Hit(request))
                .map_err(|_| Error::Internal("the Redis I/O thread has stopped")),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::Internal(
                "a hit was sent before the store was opened",
            )),
        }
    }

    /// Swaps the finished hits into `into` (which should be empty), keeping
    /// both lists' memory for the next batch.
    pub fn take(&self, into: &mut Vec<Completion>) {
        std::mem::swap(&mut *self.done.lock(), into);
    }

    /// Refuses later hits and ends the connection once the hits sent before
    /// have settled.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(Ok(open)) = self.open.get() {
            // Fails only if the dispatcher is gone, and then there is nothing to close.
            let _ = open.queue.send(Message::Close);
        }
    }
}

/// Sends the queued hits, all that are waiting at once as one batch; on
/// close (or when the store is dropped) waits for the hits sent so far, then
/// closes the connection.
async fn dispatch(mut queue: UnboundedReceiver<Message>, store: Store, done: Arc<Done>) {
    let store = Arc::new(store);
    // Every batch holds a sender: `settled` ends once all of them have finished.
    let (in_flight, mut settled) = mpsc::channel::<()>(1);
    let mut messages = Vec::with_capacity(DISPATCH_BATCH);
    let mut closing = false;
    while !closing && queue.recv_many(&mut messages, DISPATCH_BATCH).await > 0 {
        let mut ids = Vec::with_capacity(messages.len());
        let mut queries = Vec::with_capacity(messages.len());
        for message in messages.drain(..) {
            match message {
                Message::Hit(Request { id, query }) => {
                    ids.push(id);
                    queries.push(query);
                }
                Message::Close => closing = true,
            }
        }
        if !ids.is_empty() {
            let (store, done, guard) = (Arc::clone(&store), Arc::clone(&done), in_flight.clone());
            tokio::spawn(batch(store, done, ids, queries, guard));
        }
    }
    drop(in_flight);
    let _ = settled.recv().await;
    store.close();
}

async fn batch(
    store: Arc<Store>,
    done: Arc<Done>,
    ids: Vec<u32>,
    queries: Vec<Query>,
    _in_flight: mpsc::Sender<()>,
) {
    let results = AssertUnwindSafe(store.hits(&queries))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            let panicked = Err(Error::Internal("a Rust panic was caught"));
            vec![panicked; ids.len()]
        });
    done.push(
        ids.into_iter()
            .zip(results)
            .map(|(id, result)| Completion { id, result }),
    );
}
