//! redisStore's binding. `send` (raw Node-API: it runs on every hit) queues
//! a hit and returns at once; finished hits come back in batches through one
//! threadsafe function per store: counts and resetMs in the store's
//! `results` array (memory Rust owns, see [`raw::Numbers`]) as
//! `[id, count, resetMs, …]`, errors (the slow path) as `[id, error, …]`.
//!
//! On the event loop the connection settles its stores' hits itself
//! (`redis_loop`); on the I/O thread through `settle::delivery`, as every
//! threaded store does.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::{sys, JsString};
use napi_derive::napi;

use super::settle;
use super::{raw, redis_loop, throw_core};
use crate::errors::Error as CoreError;
use crate::ops::{Args, Op};
use crate::redis::stats;
use crate::redis::{Batched, Config, Options};
use crate::window;

/// What every function of one store holds.
struct StoreData {
    env: sys::napi_env,
    options: Options,
    /// Weak while idle, strong while hits are in flight (`ref`/`unref`).
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
    mode: RefCell<Mode>,
    /// One server may run on the host's libuv event loop: only real Node.js
    /// (Bun's and Deno's libuv cannot watch a socket); else the I/O thread.
    event_loop: bool,
    /// The settings `open` resolved.
    config: RefCell<Option<Config>>,
}

/// How the store sends, chosen by `open` once its settings are known.
enum Mode {
    Unopened,
    /// The settings can't be used: every hit rejects with this.
    Failed(CoreError),
    /// A Redis Cluster, Upstash's REST API, or one server on a runtime
    /// that is not Node.js: the I/O thread, results
    /// through a threadsafe function.
    Threaded {
        batched: Arc<Batched>,
        tsfn: sys::napi_threadsafe_function,
    },
    /// One server, on Node's own event loop.
    Loop(redis_loop::LoopStore),
}

impl StoreData {
    /// `open(env)`: resolves the settings against `env` (`process.env`), once.
    fn open(&self, vars: &Object) -> std::result::Result<(), CoreError> {
        if !matches!(*self.mode.borrow(), Mode::Unopened) {
            return Ok(());
        }
        let read = |name: &str| -> Option<String> {
            let value: Option<String> = vars.get(name).ok().flatten();
            value.filter(|s| !s.is_empty())
        };
        let resolved = Config::resolve(&self.options, read);
        if let Ok(config) = &resolved {
            *self.config.borrow_mut() = Some(config.clone());
        }
        let mode = match resolved {
            Err(e) => Mode::Failed(e),
            Ok(config) if config.is_cluster() || config.is_rest() || !self.event_loop => {
                // SAFETY: on the JS thread inside `open`'s callback; the
                // reference is handed to the threadsafe function's context.
                let (delivery, tsfn) = unsafe {
                    settle::delivery(self.env, "ratestore.redisStore", &self.results, self.settle)?
                };
                let batched = Arc::new(Batched::new(self.options.clone(), delivery));
                batched.open(read);
                Mode::Threaded { batched, tsfn }
            }
            Ok(config) => {
                let prefix = self.options.prefix().as_bytes().to_vec();
                // SAFETY: on the JS thread inside `open`'s callback; the
                // reference outlives the store (deleted in `Drop` below).
                match unsafe {
                    redis_loop::LoopStore::open(
                        self.env,
                        &config,
                        prefix,
                        self.settle,
                        Arc::clone(&self.results),
                    )
                } {
                    Ok(store) => Mode::Loop(store),
                    Err(e) => Mode::Failed(e),
                }
            }
        };
        *self.mode.borrow_mut() = mode;
        Ok(())
    }

    fn send(&self, id: u32, op: Op, args: Args, key: &[u16]) -> std::result::Result<(), CoreError> {
        match &*self.mode.borrow() {
            Mode::Unopened => Err(CoreError::Internal(
                "a call was made before the store was opened",
            )),
            Mode::Failed(e) => Err(e.clone()),
            Mode::Threaded { batched, .. } => batched.send(id, op, args, key),
            Mode::Loop(store) => store.send(id, op, args, key),
        }
    }

    /// Several takes as one step: `Ok(false)` if it can't go as one (a
    /// Redis Cluster whose slots the keys do not share), nothing sent.
    fn send_takes(
        &self,
        id: u32,
        takes: &[(Op, Args, &[u16])],
    ) -> std::result::Result<bool, CoreError> {
        match &*self.mode.borrow() {
            Mode::Unopened => Err(CoreError::Internal(
                "a call was made before the store was opened",
            )),
            Mode::Failed(e) => Err(e.clone()),
            Mode::Threaded { batched, .. } => batched.send_takes(id, takes),
            Mode::Loop(store) => store.send_takes(id, takes).map(|()| true),
        }
    }

    /// `ref()` (a hit is in flight) or `unref()` (none is any more).
    fn set_held(&self, held: bool) -> std::result::Result<(), CoreError> {
        let tsfn = match &*self.mode.borrow() {
            Mode::Threaded { tsfn, .. } => Some(*tsfn),
            _ => None,
        };
        // SAFETY: called on the JS thread from a JS call; the reference and
        // the threadsafe function live as long as this data (see `Drop`).
        unsafe { settle::hold(self.env, tsfn, self.settle, held) }
    }

    fn close(&self) {
        match &*self.mode.borrow() {
            Mode::Threaded { batched, .. } => batched.close(),
            Mode::Loop(store) => store.close(),
            Mode::Unopened | Mode::Failed(_) => {}
        }
        let mut mode = self.mode.borrow_mut();
        if matches!(*mode, Mode::Unopened) {
            *mode = Mode::Failed(CoreError::Closed);
        }
    }

    fn flush(&self) {
        if let Mode::Loop(store) = &*self.mode.borrow() {
            store.flush();
        }
    }

    fn stats(&self) -> [f64; stats::NUMBERS] {
        match &*self.mode.borrow() {
            Mode::Threaded { batched, .. } => batched.stats(),
            Mode::Loop(store) => store.stats(),
            Mode::Unopened | Mode::Failed(_) => [0.0; stats::NUMBERS],
        }
    }
}

impl Drop for StoreData {
    fn drop(&mut self) {
        let mode = std::mem::replace(self.mode.get_mut(), Mode::Unopened);
        let threaded = matches!(mode, Mode::Threaded { .. });
        // A loop store closes its handles here, before its reference goes.
        drop(mode);
        if !threaded {
            // SAFETY: made on this env in `redis_store`; with the I/O thread
            // the threadsafe function's `finalize` deletes it instead.
            unsafe { sys::napi_delete_reference(self.env, self.settle) };
        }
    }
}

/// The most replicas `waitForReplicas` may ask for.
const MAX_WAIT_REPLICAS: u32 = 1_000;

/// `redisStore(url, token, prefix, timeoutMs, ca, cluster, waitForReplicas, settle, eventLoop)` →
/// `{ results, open, send, flush, stats, ref, unref, close }`.
/// `settle(n, errors, events)` is called with `n` results in `results`, each
/// `[id, …answer]` in six numbers, `errors` (`[id, error, …]`, or
/// undefined) and the connection's `events` (or undefined). `eventLoop:
/// false` keeps one server off the host's event loop (on the I/O thread).
#[napi(
    js_name = "redisStore",
    ts_args_type = "url: string | undefined, token: string | undefined, prefix: string | undefined, timeoutMs: number | undefined, ca: string | undefined, cluster: boolean | undefined, waitForReplicas: number | undefined, settle: (n: number, errors: unknown[] | undefined, events: { type: string; code?: string }[] | undefined) => void, eventLoop?: boolean | undefined",
    ts_return_type = "{ results: Float64Array; open(env: object): void; resetAll(): Promise<void>; send(id: number, op: number, key: string, a: number, b: number, c: number, d: number): true | undefined; sendTakes(id: number, numbers: number[], keys: string): boolean; flush(): void; stats(): number[]; ref(): void; unref(): void; close(): void }"
)]
#[allow(clippy::too_many_arguments)]
pub fn redis_store<'e>(
    env: &'e Env,
    url: Option<String>,
    token: Option<String>,
    prefix: Option<JsString<'e>>,
    timeout_ms: Option<f64>,
    ca: Option<String>,
    cluster: Option<bool>,
    wait_replicas: Option<f64>,
    settle: Unknown<'e>,
    event_loop: Option<bool>,
) -> Result<Object<'e>> {
    let options = (|| -> std::result::Result<Options, CoreError> {
        let timeout_ms = match timeout_ms {
            Some(ms) if !window::is_positive_safe_integer(ms) => {
                return Err(CoreError::InvalidRange(
                    "timeoutMs must be a positive safe integer",
                ))
            }
            ms => ms.map(|ms| ms as u64),
        };
        let wait_replicas = match wait_replicas {
            Some(n) if !(n.fract() == 0.0 && (0.0..=f64::from(MAX_WAIT_REPLICAS)).contains(&n)) => {
                return Err(CoreError::InvalidRange(
                    "waitForReplicas must be an integer from 0 to 1000",
                ))
            }
            n => n.map(|n| n as u32),
        };
        let prefix = match prefix {
            None => None,
            Some(p) => Some(super::well_formed(
                p,
                "prefix must be a well-formed string (no lone surrogates)",
            )?),
        };
        Ok(Options {
            url,
            token,
            prefix,
            timeout_ms,
            tls_ca: ca,
            cluster,
            wait_replicas,
        })
    })()
    .map_err(|e| throw_core(env, e))?;
    let (settle_ref, results) = settle::callback(env, &settle)?;
    let data = Rc::new(StoreData {
        env: env.raw(),
        options,
        settle: settle_ref,
        results: Arc::clone(&results),
        mode: RefCell::new(Mode::Unopened),
        event_loop: event_loop.unwrap_or(true),
        config: RefCell::new(None),
    });
    // SAFETY: on the JS thread inside this #[napi] callback; `send` reads
    // its data as the `Rc<StoreData>` given here.
    let made = unsafe {
        raw::function(env.raw(), "send", send, Rc::clone(&data))
            .and_then(|send| Ok((send, results.array(env.raw())?)))
    };
    let (send, results_array) = made.map_err(|e| throw_core(env, e))?;

    let mut store = Object::new(env)?;
    // SAFETY: live values of this callback's scope.
    unsafe {
        store.set(
            "results",
            Unknown::from_raw_unchecked(env.raw(), results_array),
        )?;
        store.set("send", Unknown::from_raw_unchecked(env.raw(), send))?;
    }
    let on = |f: fn(&StoreData, &FunctionCallContext) -> std::result::Result<(), CoreError>| {
        let data = Rc::clone(&data);
        move |ctx: FunctionCallContext| {
            f(&data, &ctx)
                .map_err(|e| Error::new(Status::GenericFailure, format!("ratestore: {e}")))
        }
    };
    store.set(
        "open",
        env.create_function_from_closure::<(), _, _>(
            "open",
            on(|d, ctx| {
                let vars: Object = ctx
                    .get(0)
                    .map_err(|_| CoreError::InvalidType("env must be an object"))?;
                d.open(&vars)
            }),
        )?,
    )?;
    store.set(
        "ref",
        env.create_function_from_closure::<(), _, _>("ref", on(|d, _| d.set_held(true)))?,
    )?;
    store.set(
        "unref",
        env.create_function_from_closure::<(), _, _>("unref", on(|d, _| d.set_held(false)))?,
    )?;
    store.set(
        "close",
        env.create_function_from_closure::<(), _, _>(
            "close",
            on(|d, _| {
                d.close();
                Ok(())
            }),
        )?,
    )?;
    let resetting = Rc::clone(&data);
    store.set(
        "resetAll",
        env.create_function_from_closure::<(), _, _>("resetAll", move |ctx| {
            let task = match (&*resetting.mode.borrow(), resetting.config.borrow().clone()) {
                (Mode::Failed(e), _) => ResetAllTask::failed(e.clone()),
                (_, Some(config)) => ResetAllTask {
                    prefix: resetting.options.prefix().as_bytes().to_vec(),
                    config: Some(config),
                    error: None,
                },
                (_, None) => ResetAllTask::failed(CoreError::Internal(
                    "resetAll() was called before the store was opened",
                )),
            };
            Ok(ctx.env.spawn(task)?.promise_object())
        })?,
    )?;
    let stepping = Rc::clone(&data);
    store.set(
        "sendTakes",
        env.create_function_from_closure::<(), _, _>("sendTakes", move |ctx| {
            let sent = (|| -> std::result::Result<bool, CoreError> {
                let id: f64 = ctx
                    .get(0)
                    .map_err(|_| CoreError::InvalidType("id must be a number"))?;
                let numbers: Vec<f64> = ctx
                    .get(1)
                    .map_err(|_| CoreError::InvalidType("a step's numbers must be numbers"))?;
                let keys: JsString = ctx
                    .get(2)
                    .map_err(|_| CoreError::InvalidType("keys must be a string"))?;
                let units = keys
                    .into_utf16()
                    .map_err(|_| CoreError::InvalidType("keys must be a string"))?;
                // Its buffer ends with a NUL, which is not part of the string.
                let units = units.as_slice();
                let units = &units[..units.len().saturating_sub(1)];
                let n = numbers.len() / 6;
                if !numbers.len().is_multiple_of(6) || n == 0 || n > crate::ops::MAX_TAKES {
                    return Err(CoreError::InvalidRange("a step holds 1 to 16 takes"));
                }
                let mut takes = Vec::with_capacity(n);
                let mut from = 0;
                for take in numbers.chunks(6) {
                    let op = Op::from_code(take[0]).filter(|op| op.is_take()).ok_or(
                        CoreError::InvalidRange(
                            "a step's take must be a consume or a token bucket",
                        ),
                    )?;
                    let args = op.check([take[1], take[2], take[3], take[4]])?;
                    let len = take[5];
                    if !(len >= 0.0 && len.fract() == 0.0) {
                        return Err(CoreError::Internal("a take's key length is not a length"));
                    }
                    let key = units
                        .get(from..from + len as usize)
                        .ok_or(CoreError::Internal(
                            "the step's keys are not as long as told",
                        ))?;
                    from += len as usize;
                    takes.push((op, args, key));
                }
                if from != units.len() {
                    return Err(CoreError::Internal(
                        "the step's keys are not as long as told",
                    ));
                }
                stepping.send_takes(id as u32, &takes)
            })();
            sent.map_err(|e| throw_core(ctx.env, e))
        })?,
    )?;
    let counted = Rc::clone(&data);
    store.set(
        "stats",
        env.create_function_from_closure::<(), _, _>("stats", move |_| {
            Ok(counted.stats().to_vec())
        })?,
    )?;
    store.set(
        "flush",
        env.create_function_from_closure::<(), _, _>(
            "flush",
            on(|d, _| {
                d.flush();
                Ok(())
            }),
        )?,
    )?;
    Ok(store)
}

/// `resetAll()`: unlinks every key under the prefix, on a worker thread
/// (`redis::reset_all`), and settles its promise with the store's errors.
struct ResetAllTask {
    config: Option<Config>,
    prefix: Vec<u8>,
    error: Option<CoreError>,
}

impl ResetAllTask {
    fn failed(error: CoreError) -> ResetAllTask {
        ResetAllTask {
            config: None,
            prefix: Vec::new(),
            error: Some(error),
        }
    }
}

impl Task for ResetAllTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> Result<()> {
        if let Some(config) = &self.config {
            if let Err(e) = crate::redis::reset_all::reset_all(config, &self.prefix) {
                self.error = Some(e);
            }
        }
        match &self.error {
            None => Ok(()),
            Some(e) => Err(Error::new(
                Status::GenericFailure,
                format!("ratestore: {e}"),
            )),
        }
    }

    fn resolve(&mut self, _env: Env, _output: ()) -> Result<()> {
        Ok(())
    }

    fn reject(&mut self, env: Env, err: Error) -> Result<()> {
        let Some(e) = self.error.take() else {
            return Err(err);
        };
        // SAFETY: napi-rs calls this on the JS thread in the work's completion
        // callback, inside a handle scope of `env`.
        match unsafe { raw::error(env.raw(), &e) } {
            // SAFETY: a live value of that scope.
            Ok(js) => Err(Error::from(unsafe {
                Unknown::from_raw_unchecked(env.raw(), js)
            })),
            Err(_) => Err(err),
        }
    }
}

/// `send(id, op, key, a, b, c, d)` → true: queues an op (see `ops::Op`)
/// with its numbers; throws if the store can't take it (closed, or its
/// settings failed). Returns undefined only on failure.
unsafe extern "C" fn send(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    // SAFETY: Node-API calls this on the JS thread with its own env and info.
    unsafe {
        raw::guard(env, || {
            let ([id, op, key, a, b, c, d], data) = raw::args::<7>(env, info)?;
            // SAFETY: `data` is the Rc<StoreData> this function was made with,
            // owned by the function and freed only after it is collected.
            let data = &*data.cast::<Rc<StoreData>>();
            let id = raw::number(env, id, "id must be a number")? as u32;
            let op = Op::from_code(raw::number(env, op, "op must be a number")?)
                .ok_or(CoreError::InvalidRange("op names no operation"))?;
            let mut numbers = [0.0; 4];
            for (n, value) in numbers.iter_mut().zip([a, b, c, d]) {
                *n = raw::number(env, value, "an op's numbers must be numbers")?;
            }
            let args = op.check(numbers)?;
            raw::with_utf16(env, key, "key must be a string", |key| {
                data.send(id, op, args, key)
            })??;
            raw::boolean(env, true)
        })
    }
}
