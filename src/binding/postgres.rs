//! postgresStore's binding: each call runs on the shared I/O thread and
//! settles its own promise through a deferred. The promise resolves with the
//! op's numbers, or with the error (lib/postgres.js rejects with it), so
//! the error object is built by the same `raw::error` as every other store's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::{sys, JsString};
use napi_derive::napi;

use super::{raw, throw_core};
use crate::errors::Error as CoreError;
use crate::ops::{Answer, Op};
use crate::postgres::{Config, Options, PgStore};
use crate::redis::runtime;

/// An op's outcome, turned into a JS value on the JS thread.
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

fn numbers(answer: Answer) -> Vec<f64> {
    answer.values[..answer.len]
        .iter()
        .map(|&n| n as f64)
        .collect()
}

#[napi]
pub struct PostgresNative {
    options: Options,
    store: Option<std::result::Result<Arc<PgStore>, CoreError>>,
    closed: bool,
    /// The store's count of swept rows, kept after close().
    swept: Arc<AtomicU64>,
}

#[napi]
impl PostgresNative {
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        url: Option<String>,
        table: Option<String>,
        schema: Option<String>,
        timeout_ms: Option<u32>,
        create_table: Option<bool>,
        sslmode: Option<String>,
        tls_ca: Option<String>,
        sweep_interval_ms: Option<u32>,
    ) -> Self {
        PostgresNative {
            options: Options {
                url,
                table,
                schema,
                timeout_ms: timeout_ms.map(u64::from),
                create_table,
                sslmode,
                tls_ca,
                sweep_interval_ms: sweep_interval_ms.map(u64::from),
            },
            swept: Arc::new(AtomicU64::new(0)),
            store: None,
            closed: false,
        }
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
        let store = Config::resolve(&self.options, read).map(|c| Arc::new(PgStore::new(c, swept)));
        if let (Ok(store), Ok(handle)) = (&store, runtime::handle()) {
            PgStore::start_sweeper(store, &handle);
        }
        self.store = Some(store);
    }

    /// Expired rows the store's sweeper removed.
    #[napi]
    pub fn swept(&self) -> f64 {
        self.swept.load(Ordering::Relaxed) as f64
    }

    fn ready(&self) -> std::result::Result<Arc<PgStore>, CoreError> {
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

    /// Starts one op; its promise resolves with its numbers or its error.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn call<'e>(
        &self,
        env: &'e Env,
        op: f64,
        key: JsString,
        a: f64,
        b: f64,
        c: f64,
        d: f64,
    ) -> Result<Object<'e>> {
        let started = (|| {
            let op = Op::from_code(op).ok_or(CoreError::InvalidRange("unknown op"))?;
            let args = op.check([a, b, c, d])?;
            let units = key
                .into_utf16()
                .map_err(|_| CoreError::InvalidType("key must be a string"))?;
            // Text columns hold UTF-8 only: a lone surrogate would merge keys.
            let key = units.as_str().map_err(|_| {
                CoreError::InvalidType("postgresStore: a key with a lone surrogate can't be stored")
            })?;
            Ok::<_, CoreError>((self.ready()?, runtime::handle()?, op, args, key))
        })();
        let (store, handle, op, args, key) = started.map_err(|e| throw_core(env, e))?;
        let (deferred, promise) = env.create_deferred::<Outcome, _>()?;
        handle.spawn(async move {
            let result = store.run(op, args, key).await.map(numbers);
            deferred.resolve(move |_| Ok(Outcome(result)));
        });
        Ok(promise)
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
