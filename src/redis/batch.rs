//! The side of a store that JavaScript drives. A hit is queued to the
//! runtime thread without waiting; finished hits are collected and handed
//! back in batches, with one wake-up of the JS thread per batch rather than
//! one per hit (see NAPI costs in the README).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures_util::FutureExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::config::{Config, Options};
use super::runtime;
use super::store::{Hit, Store};
use crate::errors::{Error, Result};

/// Requests the dispatcher takes off the queue at once.
const DISPATCH_BATCH: usize = 1024;

/// A hit as JavaScript sent it; `id` tells its promise.
pub struct Request {
    pub id: u32,
    pub key: Vec<u8>,
    pub window_ms: u64,
    pub amount: i64,
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

    fn push(&self, completion: Completion) {
        let first = {
            let mut list = self.lock();
            list.push(completion);
            list.len() == 1
        };
        if first {
            (self.wake)();
        }
    }
}

struct Open {
    store: Arc<Store>,
    requests: UnboundedSender<Request>,
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
            let store = Arc::new(Store::new(&config)?);
            let (requests, queue) = unbounded_channel();
            runtime::handle()?.spawn(dispatch(queue, Arc::clone(&store), Arc::clone(&self.done)));
            Ok(Open { store, requests })
        });
    }

    /// Queues a hit; its result comes back through [`Batched::take`].
    pub fn send(&self, request: Request) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        match self.open.get() {
            Some(Ok(open)) => open
                .requests
                .send(request)
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

    /// Refuses later hits and ends the connection; hits in flight still settle.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(Ok(open)) = self.open.get() {
            open.store.close();
        }
    }
}

async fn dispatch(mut queue: UnboundedReceiver<Request>, store: Arc<Store>, done: Arc<Done>) {
    let mut batch = Vec::with_capacity(DISPATCH_BATCH);
    while queue.recv_many(&mut batch, DISPATCH_BATCH).await > 0 {
        for request in batch.drain(..) {
            tokio::spawn(hit(Arc::clone(&store), Arc::clone(&done), request));
        }
    }
}

async fn hit(store: Arc<Store>, done: Arc<Done>, request: Request) {
    let run = store.hit(&request.key, request.window_ms, request.amount);
    let result = AssertUnwindSafe(run)
        .catch_unwind()
        .await
        .unwrap_or(Err(Error::Internal("a Rust panic was caught")));
    done.push(Completion {
        id: request.id,
        result,
    });
}
