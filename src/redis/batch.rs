//! The side of a store that JavaScript drives. A hit is queued to the
//! runtime thread without waiting; finished hits are collected and handed
//! back in batches, with one wake-up of each thread per batch rather than
//! one per hit (see "How a hit travels" in the README).

use std::mem;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::FutureExt;
use tokio::sync::{mpsc, Notify};

use super::calls::Query;
use super::config::{Config, Options};
use super::stats::{self, Listener, Monitor, Tally};
use super::step;
use super::store::Store;
use crate::delivery::{Completion, Delivery, Shared};
use crate::errors::{Error, Result};
use crate::ops::{Args, Op};
use crate::runtime;
use crate::wtf8;

/// Hits sent as one pipeline at most. A larger batch goes out as several
/// pipelines, written together; each one's answers go back to JavaScript as
/// soon as they are in, so that JavaScript settles them and sends new hits
/// while the server works through the rest, rather than both take turns.
const PIPELINE: usize = 16;
/// The same over Upstash's REST API, where each pipeline is an HTTP request,
/// whose own cost (headers, a round trip through the API's proxy) outweighs
/// the wait for a larger batch.
const REST_PIPELINE: usize = 128;

/// Hits queued for the runtime: their keys side by side in one buffer.
#[derive(Default)]
struct Outbox {
    keys: Vec<u8>,
    hits: Vec<BatchCall>,
    closing: bool,
    /// Closing because the store was collected: its connections linger.
    linger: bool,
    /// The dispatcher sleeps: the next change must wake it.
    asleep: bool,
}

struct BatchCall {
    id: u32,
    key_end: usize,
    op: Op,
    args: Args,
}

impl Outbox {
    fn is_idle(&self) -> bool {
        self.hits.is_empty() && !self.closing
    }
}

impl Shared<Outbox> {
    /// Adds to the outbox, waking the dispatcher if it sleeps.
    fn push(&self, add: impl FnOnce(&mut Outbox)) {
        self.add(|outbox| {
            add(outbox);
            mem::take(&mut outbox.asleep)
        });
    }

    /// Moves what is queued into `into` (which should be empty) and returns
    /// true; if nothing is queued, returns false and marks the dispatcher
    /// asleep.
    fn take(&self, into: &mut Outbox) -> bool {
        let mut outbox = self.lock();
        if outbox.is_idle() {
            outbox.asleep = true;
            return false;
        }
        mem::swap(&mut outbox.keys, &mut into.keys);
        mem::swap(&mut outbox.hits, &mut into.hits);
        into.closing = outbox.closing;
        into.linger = outbox.linger;
        true
    }
}

struct Open {
    outbox: Arc<Shared<Outbox>>,
    /// Keys go out as JSON strings (Upstash's REST API): each must be well-formed.
    json_keys: bool,
    /// A Redis Cluster: a step's keys must share a slot.
    cluster: bool,
    monitor: Arc<Monitor>,
}

pub struct Batched {
    options: Options,
    open: OnceLock<Result<Open>>,
    closed: AtomicBool,
    done: Arc<Delivery>,
}

impl Batched {
    /// A store that reads its environment and starts its I/O only on
    /// [`Batched::open`]; its finished hits and connection events go to `done`.
    pub fn new(options: Options, done: Arc<Delivery>) -> Batched {
        Batched {
            options,
            open: OnceLock::new(),
            closed: AtomicBool::new(false),
            done,
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
            let monitor = Arc::clone(store.monitor());
            let listener: Arc<Delivery> = Arc::clone(&self.done);
            let listener: std::sync::Weak<dyn Listener> = Arc::downgrade(&listener) as _;
            monitor.listen(listener);
            let runtime = runtime::handle()?;
            let ready = Arc::new(Notify::new());
            let notify = Arc::clone(&ready);
            let outbox = Arc::new(Shared::new(Box::new(move || notify.notify_one())));
            runtime.spawn(dispatch(
                Arc::clone(&outbox),
                ready,
                store,
                Arc::clone(&self.done),
            ));
            Ok(Open {
                outbox,
                json_keys: config.is_rest(),
                cluster: config.is_cluster(),
                monitor,
            })
        });
    }

    /// The store's open state, for a call to be queued: refused once the
    /// store is closed, or if it failed to open.
    fn opened(&self) -> Result<&Open> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        match self.open.get() {
            Some(Ok(open)) => Ok(open),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::Internal(
                "a call was sent before the store was opened",
            )),
        }
    }

    /// Queues a hit on the counter at the prefix + `key` (UTF-16 code units,
    /// as JavaScript holds it, sent as WTF-8); its result comes back through
    /// [`Batched::take`] under `id`. Over REST a key with a lone surrogate is
    /// refused: WTF-8 is not UTF-8 there, and JSON carries only the latter.
    pub fn send(&self, id: u32, op: Op, args: Args, key: &[u16]) -> Result<()> {
        let open = self.opened()?;
        if open.json_keys && char::decode_utf16(key.iter().copied()).any(|c| c.is_err()) {
            return Err(Error::InvalidType(super::rest::KEY_NOT_WELL_FORMED));
        }
        let prefix = self.options.prefix().as_bytes();
        open.outbox.push(|outbox| {
            outbox.keys.extend_from_slice(prefix);
            wtf8::extend(&mut outbox.keys, key);
            outbox.keys.extend_from_slice(op.suffix(&args));
            outbox.hits.push(BatchCall {
                id,
                key_end: outbox.keys.len(),
                op,
                args,
            });
        });
        Ok(())
    }

    /// Queues several takes as one step (see [`crate::redis::step`]), its answers
    /// coming back under `id`, one per take. Answers false, queuing
    /// nothing, in a Redis Cluster whose slots the keys do not share (a
    /// script's keys must all be in one): the caller takes each on its own.
    pub fn send_takes(&self, id: u32, takes: &[(Op, Args, &[u16])]) -> Result<bool> {
        let open = self.opened()?;
        let well_formed = |key: &[u16]| char::decode_utf16(key.iter().copied()).all(|c| c.is_ok());
        if open.json_keys && !takes.iter().all(|(_, _, key)| well_formed(key)) {
            return Err(Error::InvalidType(super::rest::KEY_NOT_WELL_FORMED));
        }
        let prefix = self.options.prefix().as_bytes();
        let mut blob = Vec::new();
        for (op, args, key) in takes {
            step::push(&mut blob, *op, args, |b| {
                b.extend_from_slice(prefix);
                wtf8::extend(b, key);
            });
        }
        if open.cluster {
            let mut slots = step::keys(&blob).map(super::cluster::slot);
            let first = slots.next();
            if !slots.all(|s| Some(s) == first) {
                return Ok(false);
            }
        }
        open.outbox.push(|outbox| {
            outbox.keys.extend_from_slice(&blob);
            outbox.hits.push(BatchCall {
                id,
                key_end: outbox.keys.len(),
                op: Op::Takes,
                args: [0; 4],
            });
        });
        Ok(true)
    }

    /// The store's counts (see `stats::Tally::numbers`); zeros before it opens.
    pub fn stats(&self) -> [f64; stats::NUMBERS] {
        match self.open.get() {
            Some(Ok(open)) => open.monitor.numbers(),
            _ => Tally::default().numbers(),
        }
    }

    /// Refuses later hits and, once the hits sent before have settled,
    /// lets go of the connection (it ends unless another store with the
    /// same settings holds it).
    pub fn close(&self) {
        self.shut(false);
    }

    fn shut(&self, linger: bool) {
        if self.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(Ok(open)) = self.open.get() {
            open.outbox.push(|outbox| {
                outbox.closing = true;
                outbox.linger = linger;
            });
        }
    }
}

impl Drop for Batched {
    fn drop(&mut self) {
        // A store nobody holds any more closes too, leaving its connection
        // open a little longer for a store made in its place.
        self.shut(true);
    }
}

/// Sends the queued hits, all that are waiting at once as one batch, and
/// sleeps until woken when none are; on close waits for the hits sent so
/// far, then lets go of the connection. It never polls: a thread that spins
/// while hits are sparse costs a core for nothing.
async fn dispatch(
    outbox: Arc<Shared<Outbox>>,
    ready: Arc<Notify>,
    store: Store,
    done: Arc<Delivery>,
) {
    let store = Arc::new(store);
    // Every batch holds a sender: `settled` ends once all of them have finished.
    let (in_flight, mut settled) = mpsc::channel::<()>(1);
    loop {
        let mut taken = Outbox::default();
        if !outbox.take(&mut taken) {
            ready.notified().await;
            continue;
        }
        let (closing, linger) = (taken.closing, taken.linger);
        if !taken.hits.is_empty() {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            tokio::spawn(batch(store, done, taken, in_flight.clone()));
        }
        if closing {
            drop(in_flight);
            let _ = settled.recv().await;
            if linger {
                store.linger();
            }
            return;
        }
    }
}

async fn batch(
    store: Arc<Store>,
    done: Arc<Delivery>,
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
                op: hit.op,
                args: hit.args,
            }
        })
        .collect();
    let size = match store.is_rest() {
        true => REST_PIPELINE,
        false => PIPELINE,
    };
    let parts = queries.chunks(size).zip(outbox.hits.chunks(size));
    let parts = parts.map(|(queries, hits)| {
        let (store, done) = (&store, &done);
        async move {
            let results = AssertUnwindSafe(store.hits(queries))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    let caught = || Err(Error::Internal("a Rust panic was caught"));
                    queries.iter().map(|_| caught()).collect()
                });
            // A step's answers: one completion per take, all under its id.
            let completions = hits.iter().zip(results).flat_map(|(hit, result)| {
                let (first, rest) = match result {
                    Ok((first, rest)) => (Ok(first), rest),
                    Err(e) => (Err(e), Vec::new()),
                };
                std::iter::once(Completion {
                    id: hit.id,
                    result: first,
                })
                .chain(rest.into_iter().map(|answer| Completion {
                    id: hit.id,
                    result: Ok(answer),
                }))
            });
            done.push_all(completions);
        }
    });
    futures_util::future::join_all(parts).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_hit_wakes_the_dispatcher_only_once_it_sleeps() {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let outbox = Shared::<Outbox>::new(Box::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        let queue = |id| {
            outbox.push(|o| {
                o.keys.push(b'k');
                let key_end = o.keys.len();
                o.hits.push(BatchCall {
                    id,
                    key_end,
                    op: Op::Hit,
                    args: [1_000, 1, 0, 0],
                })
            })
        };
        let woken = || wakes.load(Ordering::Relaxed);

        // The dispatcher starts awake: the first hit needs no wake-up.
        queue(1);
        assert_eq!(woken(), 0, "an awake dispatcher needs no wake-up");
        let mut taken = Outbox::default();
        assert!(outbox.take(&mut taken));
        assert_eq!((taken.hits.len(), taken.keys.len()), (1, 1));

        assert!(
            !outbox.take(&mut Outbox::default()),
            "nothing queued: it sleeps"
        );
        queue(3);
        queue(4);
        assert_eq!(woken(), 1, "one wake-up for a sleeping dispatcher");
        outbox.push(|o| o.closing = true);
        assert_eq!(woken(), 1);
        let mut taken = Outbox::default();
        assert!(outbox.take(&mut taken));
        assert_eq!(taken.hits.iter().map(|h| h.id).collect::<Vec<_>>(), [3, 4]);
        assert!(taken.closing);
    }
}
