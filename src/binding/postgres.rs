//! postgresStore's binding: `call(id, …)` starts an op on the shared I/O
//! thread and returns at once; finished calls come back as every threaded
//! store's do (see `threaded`). `resetAll()` is rare and settles its own
//! promise through a deferred.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::JsString;
use napi_derive::napi;

use super::threaded::{Gathers, TextNative, TextStore};
use crate::errors::Error as CoreError;
use crate::ops::{Answer, Args, Op};
use crate::postgres::{PgConfig, PgOptions, PgStore};

impl Gathers for PgStore {
    type Queued = crate::postgres::Queued;

    fn queue_call(
        self: &Arc<Self>,
        op: Op,
        args: Args,
        key: String,
    ) -> std::result::Result<Self::Queued, CoreError> {
        PgStore::queue_call(self, op, args, key)
    }

    fn wait(
        self: &Arc<Self>,
        queued: Self::Queued,
    ) -> impl Future<Output = std::result::Result<Answer, CoreError>> + Send {
        PgStore::wait(self, queued)
    }
}

impl TextStore for PgStore {
    type Options = PgOptions;
    const LONE: &'static str = "postgresStore: a key with a lone surrogate can't be stored";

    fn open(
        options: &PgOptions,
        read: impl Fn(&str) -> Option<String>,
        swept: Arc<AtomicU64>,
    ) -> std::result::Result<Arc<Self>, CoreError> {
        PgConfig::resolve(options, read).map(|c| Arc::new(PgStore::new(c, swept)))
    }

    fn start_sweeper(store: &Arc<Self>, handle: &tokio::runtime::Handle) {
        PgStore::start_sweeper(store, handle)
    }

    fn run(
        self: &Arc<Self>,
        op: Op,
        args: Args,
        key: String,
    ) -> impl Future<Output = std::result::Result<Answer, CoreError>> + Send {
        PgStore::run(self, op, args, key)
    }

    fn step(
        self: &Arc<Self>,
        takes: Vec<(Op, Args, String)>,
    ) -> impl Future<Output = std::result::Result<Vec<Answer>, CoreError>> + Send {
        PgStore::step(self, takes)
    }

    fn reset_all(
        self: &Arc<Self>,
    ) -> impl Future<Output = std::result::Result<(), CoreError>> + Send {
        PgStore::reset_all(self)
    }

    async fn close(self: Arc<Self>) {
        PgStore::close(&self).await
    }
}

#[napi]
pub struct PostgresNative {
    inner: TextNative<PgStore>,
}

#[napi]
impl PostgresNative {
    /// `settle(n, errors, events)` gets the finished calls, as redisStore's does.
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        env: &Env,
        settle: Unknown,
        url: Option<String>,
        table: Option<String>,
        schema: Option<String>,
        timeout_ms: Option<u32>,
        create_table: Option<bool>,
        sslmode: Option<String>,
        tls_ca: Option<String>,
        sweep_interval_ms: Option<u32>,
    ) -> Result<Self> {
        let options = PgOptions {
            url,
            table,
            schema,
            timeout_ms: timeout_ms.map(u64::from),
            create_table,
            sslmode,
            tls_ca,
            sweep_interval_ms: sweep_interval_ms.map(u64::from),
        };
        let inner = TextNative::new(env, &settle, "ratestore.postgresStore", options)?;
        Ok(PostgresNative { inner })
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

    /// Starts the calls made in one turn of the microtask queue, in order,
    /// on one trip to the I/O thread: `numbers` holds seven per call (its
    /// id, op, four numbers and its key's length in UTF-16 units), `keys`
    /// their keys one after another; each settles under its id. Throws,
    /// starting nothing, if the store can't take calls.
    #[napi]
    pub fn calls(&self, env: &Env, numbers: Vec<f64>, keys: JsString) -> Result<()> {
        self.inner.calls(env, numbers, keys)
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
