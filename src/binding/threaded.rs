//! What the bindings of the threaded stores (postgresStore, mysqlStore,
//! sqliteStore) share: `Settler`, the settle plumbing each holds (finished
//! calls come back in batches through `settle::delivery`, numbers in
//! `results`, errors built by `raw::error`, to the JS side's settle
//! callback), `Settlement`, `resetAll()`'s answer, and `TextNative`, all of a
//! binding whose store keeps UTF-8 keys on the shared I/O thread (the SQL
//! servers'). Each binding keeps its own `#[napi]` class, constructor and
//! names, and calls these.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;
use napi::bindgen_prelude::*;
use napi::{sys, JsString};

use super::settle;
use super::{raw, throw_core};
use crate::delivery::{Completion, Delivery};
use crate::errors::Error as CoreError;
use crate::ops::{Answer, Args, Op};
use crate::runtime;

/// A store whose calls made together are queued in one go ([`TextNative::calls`]).
pub(super) trait Gathers: TextStore {
    type Queued: Send + 'static;
    /// Queues one call in its place, now: calls queued one after another
    /// in one task are in the store's queue, in that order, before any is
    /// sent, and before any call made after them.
    fn queue_call(
        self: &Arc<Self>,
        op: Op,
        args: Args,
        key: String,
    ) -> std::result::Result<Self::Queued, CoreError>;
    /// A queued call's answer.
    fn wait(
        self: &Arc<Self>,
        queued: Self::Queued,
    ) -> impl Future<Output = std::result::Result<Answer, CoreError>> + Send;
}

/// Runs one call's `answer` on the I/O thread, a panic caught, and
/// delivers its result under `id`.
async fn deliver(
    delivery: Arc<Delivery>,
    id: u32,
    answer: impl Future<Output = std::result::Result<Answer, CoreError>>,
) {
    let result = AssertUnwindSafe(answer)
        .catch_unwind()
        .await
        .unwrap_or(Err(CoreError::Internal("a Rust panic was caught")));
    delivery.push(Completion { id, result });
}

/// `resetAll()`'s outcome, turned into a JS value on the JS thread: `T`'s
/// value, or the store's error.
pub(super) struct Settlement<T>(pub std::result::Result<T, CoreError>);

impl<T: ToNapiValue> ToNapiValue for Settlement<T> {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        match val.0 {
            // SAFETY: called by napi-rs on the JS thread with a live env.
            Ok(value) => unsafe { T::to_napi_value(env, value) },
            Err(err) => {
                // SAFETY: as above.
                let error = unsafe { raw::error(env, &err) };
                error.map_err(|e| Error::from_reason(e.to_string()))
            }
        }
    }
}

/// A threaded store's way back to JS.
pub(super) struct Settler {
    /// Where finished calls go; its threadsafe function is `tsfn`.
    pub delivery: Arc<Delivery>,
    tsfn: sys::napi_threadsafe_function,
    /// The JS settle callback: weak while idle, strong while calls are in
    /// flight (`hold`). The threadsafe function's context owns it.
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
}

impl Settler {
    /// `settle(n, errors, events)` gets the finished calls, as redisStore's
    /// does; `name` names the threadsafe function.
    pub fn new(env: &Env, settle: &Unknown, name: &str) -> Result<Settler> {
        let (settle_ref, results) = settle::callback(env, settle)?;
        // SAFETY: on the JS thread inside a #[napi] callback; on success
        // the threadsafe function's context takes the reference.
        let made = unsafe { settle::delivery(env.raw(), name, &results, settle_ref) };
        let (delivery, tsfn) = match made {
            Ok(made) => made,
            Err(e) => {
                // SAFETY: nothing took the reference: it is deleted here, once.
                unsafe { sys::napi_delete_reference(env.raw(), settle_ref) };
                return Err(throw_core(env, e));
            }
        };
        Ok(Settler {
            delivery,
            tsfn,
            settle: settle_ref,
            results,
        })
    }

    /// The numbers of finished calls, `[id, …answer]` per call (see `settle`).
    pub fn results(&self, env: &Env) -> Result<Unknown<'_>> {
        // SAFETY: on the JS thread inside a #[napi] callback.
        let array = unsafe { self.results.array(env.raw()) }.map_err(|e| throw_core(env, e))?;
        // SAFETY: a live value of this callback's scope.
        Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), array) })
    }

    /// Writes the answer of a call that ran at once where a batch's first
    /// answer goes (after its id's place), for the JS side to read before
    /// anything else runs on its thread.
    pub fn answer_now(&self, answer: &Answer) {
        settle::write_answer(&self.results, 1, answer);
    }

    /// Keeps the settle callback and the process alive while calls are in
    /// flight (`true`), or lets them go (`false`).
    pub fn hold(&self, env: &Env, held: bool) -> Result<()> {
        // SAFETY: on the JS thread inside a #[napi] callback; the
        // threadsafe function and the reference live until the delivery is
        // dropped, which `self` holds.
        unsafe { settle::hold(env.raw(), Some(self.tsfn), self.settle, held) }
            .map_err(|e| throw_core(env, e))
    }
}

/// A store with UTF-8 keys whose calls run on the shared I/O thread.
pub(super) trait TextStore: Send + Sync + Sized + 'static {
    type Options;
    /// The error of a key with a lone surrogate (it would merge keys).
    const LONE: &'static str;
    /// The store for `options` resolved against `read` (the environment).
    fn open(
        options: &Self::Options,
        read: impl Fn(&str) -> Option<String>,
        swept: Arc<AtomicU64>,
    ) -> std::result::Result<Arc<Self>, CoreError>;
    fn start_sweeper(store: &Arc<Self>, handle: &tokio::runtime::Handle);
    fn run(
        self: &Arc<Self>,
        op: Op,
        args: Args,
        key: String,
    ) -> impl Future<Output = std::result::Result<Answer, CoreError>> + Send;
    fn step(
        self: &Arc<Self>,
        takes: Vec<(Op, Args, String)>,
    ) -> impl Future<Output = std::result::Result<Vec<Answer>, CoreError>> + Send;
    fn reset_all(
        self: &Arc<Self>,
    ) -> impl Future<Output = std::result::Result<(), CoreError>> + Send;
    fn close(self: Arc<Self>) -> impl Future<Output = ()> + Send;
}

/// A `TextStore`'s binding, but for its class and constructor.
pub(super) struct TextNative<S: TextStore> {
    options: S::Options,
    store: Option<std::result::Result<Arc<S>, CoreError>>,
    closed: bool,
    /// The store's count of swept rows, kept after close().
    swept: Arc<AtomicU64>,
    pub settler: Settler,
}

impl<S: TextStore> TextNative<S> {
    pub fn new(
        env: &Env,
        settle: &Unknown,
        name: &str,
        options: S::Options,
    ) -> Result<TextNative<S>> {
        Ok(TextNative {
            settler: Settler::new(env, settle, name)?,
            options,
            swept: Arc::new(AtomicU64::new(0)),
            store: None,
            closed: false,
        })
    }

    /// Resolves the settings against `vars` (`process.env`), once.
    pub fn open(&mut self, vars: Object) {
        if self.store.is_some() {
            return;
        }
        let read = |name: &str| -> Option<String> {
            let value: Option<String> = vars.get(name).ok().flatten();
            value.filter(|s| !s.is_empty())
        };
        let store = S::open(&self.options, read, Arc::clone(&self.swept));
        if let (Ok(store), Ok(handle)) = (&store, runtime::handle()) {
            S::start_sweeper(store, &handle);
        }
        self.store = Some(store);
    }

    /// Expired rows the store's sweeper removed.
    pub fn swept(&self) -> f64 {
        self.swept.load(Ordering::Relaxed) as f64
    }

    fn ready(&self) -> std::result::Result<Arc<S>, CoreError> {
        if self.closed {
            return Err(CoreError::Closed);
        }
        match &self.store {
            Some(Ok(store)) => Ok(Arc::clone(store)),
            Some(Err(e)) => Err(e.clone()),
            None => Err(CoreError::Internal(
                "a call was made before the store was opened",
            )),
        }
    }

    /// Starts one op; it settles under `id` through `settle`. Throws if the
    /// store can't take it (closed, or its settings failed).
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        env: &Env,
        id: u32,
        op: f64,
        key: JsString,
        a: f64,
        b: f64,
        c: f64,
        d: f64,
    ) -> Result<()> {
        let started = (|| {
            let op = Op::from_code(op).ok_or(CoreError::InvalidRange("unknown op"))?;
            let args = op.check([a, b, c, d])?;
            let units = key
                .into_utf16()
                .map_err(|_| CoreError::InvalidType("key must be a string"))?;
            // Text columns hold UTF-8 only: a lone surrogate would merge keys.
            let key = units
                .as_str()
                .map_err(|_| CoreError::InvalidType(S::LONE))?;
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, op, args, key))
        })();
        let (store, handle, op, args, key) = started.map_err(|e| throw_core(env, e))?;
        let delivery = Arc::clone(&self.settler.delivery);
        handle.spawn(deliver(delivery, id, async move {
            store.run(op, args, key).await
        }));
        Ok(())
    }

    /// Starts a step: its takes made all or none, in one transaction
    /// (see `text_step`); each take settles under its id. Throws, starting
    /// nothing, if a take is not one or the store can't take it.
    pub fn takes(&self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        let started = (|| {
            let (ids, takes) = super::text_step(&numbers, keys, S::LONE)?;
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, ids, takes))
        })();
        let (store, handle, ids, takes) = started.map_err(|e| throw_core(env, e))?;
        let delivery = Arc::clone(&self.settler.delivery);
        handle.spawn(async move {
            let result = AssertUnwindSafe(store.step(takes))
                .catch_unwind()
                .await
                .unwrap_or(Err(CoreError::Internal("a Rust panic was caught")));
            delivery.push_all(super::step_completions(&ids, &result));
        });
        Ok(())
    }

    /// Deletes every counter of the store; the promise resolves to `[]`.
    pub fn reset_all<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let started = (|| Ok::<_, CoreError>((self.ready()?, runtime::handle()?)))();
        let (store, handle) = started.map_err(|e| throw_core(env, e))?;
        let (deferred, promise) = env.create_deferred::<Settlement<Vec<f64>>, _>()?;
        handle.spawn(async move {
            let result = store.reset_all().await.map(|()| Vec::new());
            deferred.resolve(move |_| Ok(Settlement(result)));
        });
        Ok(promise)
    }

    /// Refuses later calls and drops the connection.
    pub fn close(&mut self) {
        self.closed = true;
        if let Some(Ok(store)) = self.store.take() {
            if let Ok(handle) = runtime::handle() {
                handle.spawn(async move { store.close().await });
            }
        }
    }
}

impl<S: Gathers> TextNative<S> {
    /// Starts the calls JavaScript made in one turn of the microtask queue
    /// (it gathers them): `numbers` holds seven per call (its id, op, four
    /// numbers and its key's length in UTF-16 units), `keys` their keys one
    /// after another. One trip to the I/O thread for all of them, where they
    /// join the store's queue in the order they were made, all in one go
    /// ([`Gathers::queue_call`]: so they share the next batch, and no call
    /// made after them goes first); each settles under its id when it has
    /// finished. A call whose numbers or key the store can't take fails
    /// alone. Throws, starting nothing, if the store can't take calls
    /// (closed, or its settings failed) or the numbers and keys disagree.
    pub fn calls(&self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        let started = (|| {
            let units = keys
                .into_utf16()
                .map_err(|_| CoreError::InvalidType("keys must be a string"))?;
            if !numbers.len().is_multiple_of(super::TAKE_NUMBERS) {
                return Err(CoreError::Internal(
                    "the calls' numbers are not whole calls",
                ));
            }
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, units))
        })();
        let (store, handle, units) = started.map_err(|e| throw_core(env, e))?;
        let units = units.as_slice();
        // (Without the terminating NUL.)
        let units = &units[..units.len().saturating_sub(1)];
        let untold = || {
            throw_core(
                env,
                CoreError::Internal("the calls' keys are not as long as told"),
            )
        };
        let mut calls = Vec::with_capacity(numbers.len() / super::TAKE_NUMBERS);
        let mut failed = Vec::new();
        let mut from = 0usize;
        for n in numbers.chunks_exact(super::TAKE_NUMBERS) {
            let (id, len) = (n[0], n[6]);
            let whole = |v: f64| v >= 0.0 && v.fract() == 0.0;
            if !(whole(id) && id <= f64::from(u32::MAX) && whole(len)) {
                return Err(throw_core(
                    env,
                    CoreError::Internal("a call's id or key length is not one"),
                ));
            }
            let end = from
                .checked_add(len as usize)
                .filter(|&end| end <= units.len())
                .ok_or_else(untold)?;
            let key = &units[from..end];
            from = end;
            let call = (|| {
                let op = Op::from_code(n[1]).ok_or(CoreError::InvalidRange("unknown op"))?;
                let args = op.check([n[2], n[3], n[4], n[5]])?;
                // Text columns hold UTF-8 only: a lone surrogate would merge keys.
                let key = String::from_utf16(key).map_err(|_| CoreError::InvalidType(S::LONE))?;
                Ok::<_, CoreError>((op, args, key))
            })();
            match call {
                Ok((op, args, key)) => calls.push((id as u32, op, args, key)),
                Err(e) => failed.push(Completion {
                    id: id as u32,
                    result: Err(e),
                }),
            }
        }
        if from != units.len() {
            return Err(untold());
        }
        let delivery = Arc::clone(&self.settler.delivery);
        if !failed.is_empty() {
            delivery.push_all(failed);
        }
        if calls.is_empty() {
            return Ok(());
        }
        handle.spawn(async move {
            // All queued in this one poll, in order; then each waits in a task of its own.
            let mut queued = Vec::with_capacity(calls.len());
            for (id, op, args, key) in calls {
                match store.queue_call(op, args, key) {
                    Ok(q) => queued.push((id, q)),
                    Err(e) => delivery.push(Completion { id, result: Err(e) }),
                }
            }
            for (id, q) in queued {
                let store = Arc::clone(&store);
                let answer = async move { store.wait(q).await };
                tokio::spawn(deliver(Arc::clone(&delivery), id, answer));
            }
        });
        Ok(())
    }
}
