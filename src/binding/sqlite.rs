//! sqliteStore's binding: `call(id, …)` queues an op to the store's own
//! thread and returns at once; finished calls come back as every threaded
//! store's do, in batches through `settle::delivery` (numbers in the store's
//! `results`, errors built by `raw::error`), to the JS side's settle
//! callback. `resetAll()` is rare and settles its own promise through a
//! deferred.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use napi::bindgen_prelude::*;
use napi::{sys, JsString};
use napi_derive::napi;

use super::settle;
use super::{raw, throw_core};
use crate::delivery::Delivery;
use crate::errors::Error as CoreError;
use crate::ops::Op;
use crate::sqlite::{Call, Config, Counts, Options, SqliteStore, Step};

/// `resetAll()`'s outcome, turned into a JS value on the JS thread.
struct Outcome(std::result::Result<(), CoreError>);

impl ToNapiValue for Outcome {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        match val.0 {
            // SAFETY: called by napi-rs on the JS thread with a live env.
            Ok(()) => unsafe { <()>::to_napi_value(env, ()) },
            Err(err) => {
                // SAFETY: as above.
                let error = unsafe { raw::error(env, &err) };
                error.map_err(|e| Error::from_reason(e.to_string()))
            }
        }
    }
}

#[napi]
pub struct SqliteNative {
    options: Options,
    /// The store, started by the first call (its thread opens the file).
    store: Option<std::result::Result<Arc<SqliteStore>, CoreError>>,
    closed: bool,
    counts: Arc<Counts>,
    /// Where finished calls go; its threadsafe function is `tsfn`.
    delivery: Arc<Delivery>,
    tsfn: sys::napi_threadsafe_function,
    /// The JS settle callback: weak while idle, strong while calls are in
    /// flight (`hold`). The threadsafe function's context owns it.
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
}

#[napi]
impl SqliteNative {
    /// `settle(n, errors, events)` gets the finished calls, as redisStore's does.
    #[napi(constructor)]
    pub fn new(
        env: &Env,
        settle: Unknown,
        path: Option<String>,
        timeout_ms: Option<u32>,
        synchronous: Option<String>,
        sweep_interval_ms: Option<u32>,
    ) -> Result<Self> {
        let options = Options {
            path,
            timeout_ms: timeout_ms.map(u64::from),
            synchronous,
            sweep_interval_ms: sweep_interval_ms.map(u64::from),
        };
        // Settings are checked here, so a bad one throws at construction.
        Config::resolve(&options).map_err(|e| throw_core(env, e))?;
        let (settle_ref, results) = settle::callback(env, &settle)?;
        // SAFETY: on the JS thread inside this #[napi] callback; on success
        // the threadsafe function's context takes the reference.
        let made =
            unsafe { settle::delivery(env.raw(), "ratestore.sqliteStore", &results, settle_ref) };
        let (delivery, tsfn) = match made {
            Ok(made) => made,
            Err(e) => {
                // SAFETY: nothing took the reference: it is deleted here, once.
                unsafe { sys::napi_delete_reference(env.raw(), settle_ref) };
                return Err(throw_core(env, e));
            }
        };
        Ok(SqliteNative {
            options,
            store: None,
            closed: false,
            counts: Arc::new(Counts::default()),
            delivery,
            tsfn,
            settle: settle_ref,
            results,
        })
    }

    /// The numbers of finished calls, `[id, …answer]` per call (see `settle`).
    #[napi(ts_return_type = "Float64Array")]
    pub fn results(&self, env: &Env) -> Result<Unknown<'_>> {
        // SAFETY: on the JS thread inside this #[napi] callback.
        let array = unsafe { self.results.array(env.raw()) }.map_err(|e| throw_core(env, e))?;
        // SAFETY: a live value of this callback's scope.
        Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), array) })
    }

    /// Keeps the settle callback and the process alive while calls are in
    /// flight (`true`), or lets them go (`false`).
    #[napi]
    pub fn hold(&self, env: &Env, held: bool) -> Result<()> {
        // SAFETY: on the JS thread inside this #[napi] callback; the
        // threadsafe function and the reference live until the delivery is
        // dropped, which `self` holds.
        unsafe { settle::hold(env.raw(), Some(self.tsfn), self.settle, held) }
            .map_err(|e| throw_core(env, e))
    }

    /// `[swept, commits, busyWaits]`: the store's thread's counts.
    #[napi]
    pub fn counts(&self) -> Vec<f64> {
        let c = &self.counts;
        [&c.swept, &c.commits, &c.busy_waits]
            .map(|n| n.load(Ordering::Relaxed) as f64)
            .to_vec()
    }

    fn ready(&mut self) -> std::result::Result<Arc<SqliteStore>, CoreError> {
        if self.closed {
            return Err(CoreError::Closed);
        }
        if self.store.is_none() {
            let started = Config::resolve(&self.options).and_then(|config| {
                SqliteStore::start(config, Arc::clone(&self.delivery), Arc::clone(&self.counts))
            });
            self.store = Some(started.map(Arc::new));
        }
        match &self.store {
            Some(Ok(store)) => Ok(Arc::clone(store)),
            Some(Err(e)) => Err(e.clone()),
            None => Err(CoreError::Internal("the store was not started")),
        }
    }

    /// Queues one op; it settles under `id` through `settle`. Throws if the
    /// store can't take it (closed, or its thread could not start).
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
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
            // The units end with the NUL that napi adds.
            let units = units.as_slice();
            let units = &units[..units.len().saturating_sub(1)];
            let mut bytes = Vec::new();
            crate::wtf8::extend(&mut bytes, units);
            let store = self.ready()?;
            store.call(Call {
                id,
                op,
                args,
                key: bytes,
                deadline: Instant::now() + store.timeout,
            })
        })();
        started.map_err(|e| throw_core(env, e))
    }

    /// Queues a step: its takes made all or none. `numbers` holds seven
    /// per take (its id, op, four numbers and its key's length in UTF-16
    /// units), `keys` their keys one after another; each take settles under
    /// its id. Throws, queuing nothing, if a take is not one or the store
    /// can't take it.
    #[napi]
    pub fn takes(&mut self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        let started = (|| {
            let units = keys
                .into_utf16()
                .map_err(|_| CoreError::InvalidType("keys must be a string"))?;
            let units = units.as_slice();
            let units = &units[..units.len().saturating_sub(1)];
            let takes = super::step_takes(&numbers, units)?;
            let store = self.ready()?;
            let deadline = Instant::now() + store.timeout;
            let calls = takes
                .into_iter()
                .map(|(id, op, args, key)| {
                    let mut bytes = Vec::new();
                    crate::wtf8::extend(&mut bytes, key);
                    Call {
                        id,
                        op,
                        args,
                        key: bytes,
                        deadline,
                    }
                })
                .collect();
            store.step(Step::new(calls)?)
        })();
        started.map_err(|e| throw_core(env, e))
    }

    /// Deletes every counter of the file.
    #[napi]
    pub fn reset_all<'e>(&mut self, env: &'e Env) -> Result<Object<'e>> {
        let store = self.ready().map_err(|e| throw_core(env, e))?;
        let (deferred, promise) = env.create_deferred::<Outcome, _>()?;
        store.reset_all(Box::new(move |result| {
            deferred.resolve(move |_| Ok(Outcome(result)));
        }));
        Ok(promise)
    }

    /// Refuses later calls; the store's thread finishes the queued ones,
    /// then closes the file.
    #[napi]
    pub fn close(&mut self) {
        self.closed = true;
        if let Some(Ok(store)) = self.store.take() {
            store.close();
        }
    }
}
