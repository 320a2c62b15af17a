//! mysqlStore's binding, the shape of postgresStore's: `call(id, …)` starts
//! an op on the shared I/O thread and returns at once; finished calls come
//! back in batches through `settle::delivery` to the JS side's settle
//! callback. `resetAll()` settles its own promise through a deferred.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;
use napi::bindgen_prelude::*;
use napi::{sys, JsString};
use napi_derive::napi;

use super::settle;
use super::{raw, throw_core};
use crate::delivery::{Completion, Delivery};
use crate::errors::Error as CoreError;
use crate::mysql::{Config, MyStore, Options};
use crate::ops::Op;
use crate::redis::runtime;

/// `resetAll()`'s outcome, turned into a JS value on the JS thread.
struct Outcome(std::result::Result<Vec<f64>, CoreError>);

impl ToNapiValue for Outcome {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        match val.0 {
            // SAFETY: called by napi-rs on the JS thread with a live env.
            Ok(numbers) => unsafe { Vec::<f64>::to_napi_value(env, numbers) },
            Err(err) => {
                // SAFETY: as above.
                let error = unsafe { raw::error(env, &err) };
                error.map_err(|e| Error::from_reason(e.to_string()))
            }
        }
    }
}

#[napi]
pub struct MysqlNative {
    options: Options,
    store: Option<std::result::Result<Arc<MyStore>, CoreError>>,
    closed: bool,
    /// The store's count of swept rows, kept after close().
    swept: Arc<AtomicU64>,
    /// Where finished calls go; its threadsafe function is `tsfn`.
    delivery: Arc<Delivery>,
    tsfn: sys::napi_threadsafe_function,
    /// The JS settle callback: weak while idle, strong while calls are in
    /// flight (`hold`). The threadsafe function's context owns it.
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
}

#[napi]
impl MysqlNative {
    /// `settle(n, errors, events)` gets the finished calls, as redisStore's does.
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        env: &Env,
        settle: Unknown,
        url: Option<String>,
        table: Option<String>,
        timeout_ms: Option<u32>,
        create_table: Option<bool>,
        ssl_mode: Option<String>,
        tls_ca: Option<String>,
        sweep_interval_ms: Option<u32>,
        connections: Option<u32>,
    ) -> Result<Self> {
        let (settle_ref, results) = settle::callback(env, &settle)?;
        // SAFETY: on the JS thread inside this #[napi] callback; on success
        // the threadsafe function's context takes the reference.
        let made =
            unsafe { settle::delivery(env.raw(), "ratestore.mysqlStore", &results, settle_ref) };
        let (delivery, tsfn) = match made {
            Ok(made) => made,
            Err(e) => {
                // SAFETY: nothing took the reference: it is deleted here, once.
                unsafe { sys::napi_delete_reference(env.raw(), settle_ref) };
                return Err(throw_core(env, e));
            }
        };
        Ok(MysqlNative {
            delivery,
            tsfn,
            settle: settle_ref,
            results,
            options: Options {
                url,
                table,
                timeout_ms: timeout_ms.map(u64::from),
                create_table,
                ssl_mode,
                tls_ca,
                sweep_interval_ms: sweep_interval_ms.map(u64::from),
                connections: connections.map(|n| n as usize),
            },
            swept: Arc::new(AtomicU64::new(0)),
            store: None,
            closed: false,
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

    /// Resolves the settings against `vars` (`process.env`), once.
    #[napi]
    pub fn open(&mut self, vars: Object) {
        if self.store.is_some() {
            return;
        }
        let read = |name: &str| -> Option<String> {
            let value: Option<String> = vars.get(name).ok().flatten();
            value.filter(|s| !s.is_empty())
        };
        let swept = Arc::clone(&self.swept);
        let store = Config::resolve(&self.options, read).map(|c| Arc::new(MyStore::new(c, swept)));
        if let (Ok(store), Ok(handle)) = (&store, runtime::handle()) {
            MyStore::start_sweeper(store, &handle);
        }
        self.store = Some(store);
    }

    /// Expired rows the store's sweeper removed.
    #[napi]
    pub fn swept(&self) -> f64 {
        self.swept.load(Ordering::Relaxed) as f64
    }

    fn ready(&self) -> std::result::Result<Arc<MyStore>, CoreError> {
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
    #[napi]
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
            let key = units.as_str().map_err(|_| {
                CoreError::InvalidType("mysqlStore: a key with a lone surrogate can't be stored")
            })?;
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, op, args, key))
        })();
        let (store, handle, op, args, key) = started.map_err(|e| throw_core(env, e))?;
        let delivery = Arc::clone(&self.delivery);
        handle.spawn(async move {
            let result = AssertUnwindSafe(store.run(op, args, key))
                .catch_unwind()
                .await
                .unwrap_or(Err(CoreError::Internal("a Rust panic was caught")));
            delivery.push(Completion { id, result });
        });
        Ok(())
    }

    /// Starts a step: its takes made all or none, in one transaction.
    /// `numbers` holds seven per take (its id, op, four numbers and its
    /// key's length in UTF-16 units), `keys` their keys one after another;
    /// each take settles under its id. Throws, starting nothing, if a take
    /// is not one or the store can't take it.
    #[napi]
    pub fn takes(&self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        let started = (|| {
            let (ids, takes) = super::text_step(
                &numbers,
                keys,
                "mysqlStore: a key with a lone surrogate can't be stored",
            )?;
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, ids, takes))
        })();
        let (store, handle, ids, takes) = started.map_err(|e| throw_core(env, e))?;
        let delivery = Arc::clone(&self.delivery);
        handle.spawn(async move {
            let result = AssertUnwindSafe(store.step(takes))
                .catch_unwind()
                .await
                .unwrap_or(Err(CoreError::Internal("a Rust panic was caught")));
            delivery.push_all(super::step_completions(&ids, &result));
        });
        Ok(())
    }

    /// Deletes every counter of the table.
    #[napi]
    pub fn reset_all<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let started = (|| Ok::<_, CoreError>((self.ready()?, runtime::handle()?)))();
        let (store, handle) = started.map_err(|e| throw_core(env, e))?;
        let (deferred, promise) = env.create_deferred::<Outcome, _>()?;
        handle.spawn(async move {
            let result = store.reset_all().await.map(|()| Vec::new());
            deferred.resolve(move |_| Ok(Outcome(result)));
        });
        Ok(promise)
    }

    /// Refuses later calls and drops the connection.
    #[napi]
    pub fn close(&mut self) {
        self.closed = true;
        if let Some(Ok(store)) = self.store.take() {
            if let Ok(handle) = runtime::handle() {
                handle.spawn(async move { store.close().await });
            }
        }
    }
}
