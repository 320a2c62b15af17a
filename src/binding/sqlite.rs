//! sqliteStore's binding: `call(id, …)` queues an op to the store's own
//! thread and returns at once; finished calls come back as every threaded
//! store's do (see `threaded`). `resetAll()` is rare and settles its own
//! promise through a deferred.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use napi::bindgen_prelude::*;
use napi::JsString;
use napi_derive::napi;

use super::threaded::{Settlement, Settler};
use super::throw_core;
use crate::errors::Error as CoreError;
use crate::ops::Op;
use crate::sqlite::{Call, Counts, SqliteConfig, SqliteOptions, SqliteStore, Step};

#[napi]
pub struct SqliteNative {
    options: SqliteOptions,
    /// The store, started by the first call (its thread opens the file).
    store: Option<std::result::Result<Arc<SqliteStore>, CoreError>>,
    closed: bool,
    counts: Arc<Counts>,
    settler: Settler,
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
        let options = SqliteOptions {
            path,
            timeout_ms: timeout_ms.map(u64::from),
            synchronous,
            sweep_interval_ms: sweep_interval_ms.map(u64::from),
        };
        // Settings are checked here, so a bad one throws at construction.
        SqliteConfig::resolve(&options).map_err(|e| throw_core(env, e))?;
        let settler = Settler::new(env, &settle, "ratestore.sqliteStore")?;
        Ok(SqliteNative {
            options,
            store: None,
            closed: false,
            counts: Arc::new(Counts::default()),
            settler,
        })
    }

    /// The numbers of finished calls, `[id, …answer]` per call (see `settle`).
    #[napi(ts_return_type = "Float64Array")]
    pub fn results(&self, env: &Env) -> Result<Unknown<'_>> {
        self.settler.results(env)
    }

    /// Keeps the settle callback and the process alive while calls are in
    /// flight (`true`), or lets them go (`false`).
    #[napi]
    pub fn hold(&self, env: &Env, held: bool) -> Result<()> {
        self.settler.hold(env, held)
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
            let started = SqliteConfig::resolve(&self.options).and_then(|config| {
                SqliteStore::start(
                    config,
                    Arc::clone(&self.settler.delivery),
                    Arc::clone(&self.counts),
                )
            });
            self.store = Some(started.map(Arc::new));
        }
        match &self.store {
            Some(Ok(store)) => Ok(Arc::clone(store)),
            Some(Err(e)) => Err(e.clone()),
            None => Err(CoreError::Internal("the store was not started")),
        }
    }

    /// Makes one op: `true` when it ran at once (`at_once` asked for it and
    /// the store was idle), its answer in `results` after the id's place, as
    /// a batch's first; `false` when it settles later under `id` through
    /// `settle`. Throws if the store can't take it (closed, or its thread
    /// could not start).
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
        at_once: Option<bool>,
    ) -> Result<bool> {
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
            let call = Call {
                id,
                op,
                args,
                key: bytes,
                deadline: Instant::now() + store.timeout,
            };
            store.call(call, at_once.unwrap_or(false))
        })();
        match started {
            Ok(Some(answer)) => {
                self.settler.answer_now(&answer);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(throw_core(env, e)),
        }
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
        let (deferred, promise) = env.create_deferred::<Settlement<()>, _>()?;
        store.reset_all(Box::new(move |result| {
            deferred.resolve(move |_| Ok(Settlement(result)));
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
