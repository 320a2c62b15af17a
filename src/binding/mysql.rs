//! mysqlStore's binding, the shape of postgresStore's: `call(id, …)` starts
//! an op on the shared I/O thread and returns at once; finished calls come
//! back as every threaded store's do (see `threaded`). `resetAll()` settles
//! its own promise through a deferred.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::JsString;
use napi_derive::napi;

use super::threaded::{TextNative, TextStore};
use crate::errors::Error as CoreError;
use crate::mysql::{MyConfig, MyOptions, MyStore};
use crate::ops::{Answer, Args, Op};

impl TextStore for MyStore {
    type Options = MyOptions;
    const LONE: &'static str = "mysqlStore: a key with a lone surrogate can't be stored";

    fn open(
        options: &MyOptions,
        read: impl Fn(&str) -> Option<String>,
        swept: Arc<AtomicU64>,
    ) -> std::result::Result<Arc<Self>, CoreError> {
        MyConfig::resolve(options, read).map(|c| Arc::new(MyStore::new(c, swept)))
    }

    fn start_sweeper(store: &Arc<Self>, handle: &tokio::runtime::Handle) {
        MyStore::start_sweeper(store, handle)
    }

    fn run(
        self: &Arc<Self>,
        op: Op,
        args: Args,
        key: String,
    ) -> impl Future<Output = std::result::Result<Answer, CoreError>> + Send {
        MyStore::run(self, op, args, key)
    }

    fn step(
        self: &Arc<Self>,
        takes: Vec<(Op, Args, String)>,
    ) -> impl Future<Output = std::result::Result<Vec<Answer>, CoreError>> + Send {
        MyStore::step(self, takes)
    }

    fn reset_all(
        self: &Arc<Self>,
    ) -> impl Future<Output = std::result::Result<(), CoreError>> + Send {
        MyStore::reset_all(self)
    }

    async fn close(self: Arc<Self>) {
        MyStore::close(&self).await
    }
}

#[napi]
pub struct MysqlNative {
    inner: TextNative<MyStore>,
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
        let options = MyOptions {
            url,
            table,
            timeout_ms: timeout_ms.map(u64::from),
            create_table,
            ssl_mode,
            tls_ca,
            sweep_interval_ms: sweep_interval_ms.map(u64::from),
            connections: connections.map(|n| n as usize),
        };
        let inner = TextNative::new(env, &settle, "ratestore.mysqlStore", options)?;
        Ok(MysqlNative { inner })
    }

    /// The numbers of finished calls, `[id, …answer]` per call (see `settle`).
    #[napi(ts_return_type = "Float64Array")]
    pub fn results(&self, env: &Env) -> Result<Unknown<'_>> {
        self.inner.settler.results(env)
    }

    /// Keeps the settle callback and the process alive while calls are in
    /// flight (`true`), or lets them go (`false`).
    #[napi]
    pub fn hold(&self, env: &Env, held: bool) -> Result<()> {
        self.inner.settler.hold(env, held)
    }

    /// Resolves the settings against `vars` (`process.env`), once.
    #[napi]
    pub fn open(&mut self, vars: Object) {
        self.inner.open(vars)
    }

    /// Expired rows the store's sweeper removed.
    #[napi]
    pub fn swept(&self) -> f64 {
        self.inner.swept()
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
        self.inner.call(env, id, op, key, a, b, c, d)
    }

    /// Starts a step: its takes made all or none, in one transaction.
    /// `numbers` holds seven per take (its id, op, four numbers and its
    /// key's length in UTF-16 units), `keys` their keys one after another;
    /// each take settles under its id. Throws, starting nothing, if a take
    /// is not one or the store can't take it.
    #[napi]
    pub fn takes(&self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        self.inner.takes(env, numbers, keys)
    }

    /// Deletes every counter of the table.
    #[napi]
    pub fn reset_all<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.inner.reset_all(env)
    }

    /// Refuses later calls and drops the connection.
    #[napi]
    pub fn close(&mut self) {
        self.inner.close()
    }
}
