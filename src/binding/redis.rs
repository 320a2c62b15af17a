//! redisStore's binding. `send` queues a hit and returns at once; finished
//! hits come back in batches through one threadsafe function per store:
//! counts and resetMs in a shared Float64Array as `[id, count, resetMs, …]`,
//! errors (the slow path) as `[id, error, …]`.
//!
//! The threadsafe function is referenced only while hits are in flight (JS
//! calls `ref`/`unref`), so an idle store never keeps Node.js alive and a
//! pending hit always does. The JS callback is held the same way: weakly when
//! idle, so a store nobody holds can be collected.

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use napi::sys;

use super::raw;
use crate::errors::Error;
use crate::redis::{Batched, Completion, Options};
use crate::window;

/// Hits one call of the JS callback hands over at most.
const BATCH: usize = 1024;

pub unsafe fn register(env: sys::napi_env, exports: sys::napi_value) -> Result<(), Error> {
    raw::export(env, exports, "redisStore", create, ptr::null_mut())?;
    Ok(())
}

/// The threadsafe function, until it is released or finalized: never called after.
struct Slot(Mutex<Option<Tsfn>>);

struct Tsfn(sys::napi_threadsafe_function);

// SAFETY: Node-API allows calling and releasing a threadsafe function from any thread.
unsafe impl Send for Tsfn {}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Option<Tsfn>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The store's wake-up, owned by the core: released when the core drops it.
struct Wake(Arc<Slot>);

impl Wake {
    fn wake(&self) {
        if let Some(tsfn) = &*self.0.lock() {
            // SAFETY: the slot holds the function only while it is alive.
            unsafe {
                sys::napi_call_threadsafe_function(
                    tsfn.0,
                    ptr::null_mut(),
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                );
            }
        }
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        if let Some(tsfn) = self.0.lock().take() {
            // SAFETY: as above; taken out of the slot, so released once.
            unsafe {
                sys::napi_release_threadsafe_function(
                    tsfn.0,
                    sys::ThreadsafeFunctionReleaseMode::release,
                );
            }
        }
    }
}

/// What the threadsafe function's JS-thread side needs; freed by `finalize`.
struct Context {
    batched: Weak<Batched>,
    slot: Arc<Slot>,
    settle: sys::napi_ref,
    results_ref: sys::napi_ref,
    results: *mut f64,
    scratch: Vec<Completion>,
}

/// What each of the store's functions holds.
struct Bound {
    batched: Arc<Batched>,
    tsfn: sys::napi_threadsafe_function,
    settle: sys::napi_ref,
}

/// `redisStore(url, token, prefix, timeoutMs, ca, cluster, settle)` →
/// `{ results, open, send, ref, unref, close }`. `settle(n, errors)` is
/// called with `n` results in `results` and `errors` (or undefined).
unsafe extern "C" fn create(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let ([url, token, prefix, timeout_ms, ca, cluster, settle], _) = raw::args::<7>(env, info)?;
        let timeout_ms = match raw::is_undefined(env, timeout_ms)? {
            true => None,
            false => {
                let ms = raw::number(env, timeout_ms, "timeoutMs must be a number")?;
                if !window::is_positive_safe_integer(ms) {
                    return Err(Error::InvalidRange(
                        "timeoutMs must be a positive safe integer",
                    ));
                }
                Some(ms as u64)
            }
        };
        let options = Options {
            url: raw::optional_string(env, url, "url must be a string")?,
            token: raw::optional_string(env, token, "token must be a string")?,
            prefix: raw::optional_string(env, prefix, "prefix must be a string")?,
            timeout_ms,
            tls_ca: raw::optional_string(env, ca, "tls.ca must be a string")?,
            cluster: raw::optional_bool(env, cluster, "cluster must be a boolean")?,
        };
        let slot = Arc::new(Slot(Mutex::new(None)));
        let wake = Wake(Arc::clone(&slot));
        let batched = Arc::new(Batched::new(options, Box::new(move || wake.wake())));

        let (results_array, results) = raw::float64_array(env, 3 * BATCH)?;
        let mut results_ref = ptr::null_mut();
        raw::check(sys::napi_create_reference(
            env,
            results_array,
            1,
            &mut results_ref,
        ))?;
        let mut settle_ref = ptr::null_mut();
        raw::check(sys::napi_create_reference(env, settle, 0, &mut settle_ref))?;
        let context = Box::into_raw(Box::new(Context {
            batched: Arc::downgrade(&batched),
            slot: Arc::clone(&slot),
            settle: settle_ref,
            results_ref,
            results,
            scratch: Vec::new(),
        }));
        let mut tsfn = ptr::null_mut();
        let created = sys::napi_create_threadsafe_function(
            env,
            ptr::null_mut(),
            ptr::null_mut(),
            raw::js_string(env, "ratestore.redisStore"),
            0,
            1,
            context.cast(),
            Some(finalize),
            context.cast(),
            Some(deliver),
            &mut tsfn,
        );
        if let Err(e) = raw::check(created) {
            finalize(env, context.cast(), ptr::null_mut());
            return Err(e);
        }
        *slot.lock() = Some(Tsfn(tsfn));
        // Idle until a hit is in flight.
        raw::check(sys::napi_unref_threadsafe_function(env, tsfn))?;

        let mut store = ptr::null_mut();
        raw::check(sys::napi_create_object(env, &mut store))?;
        raw::check(sys::napi_set_named_property(
            env,
            store,
            c"results".as_ptr(),
            results_array,
        ))?;
        let functions: [(&str, raw::Callback); 5] = [
            ("open", open),
            ("send", send),
            ("ref", hold),
            ("unref", release),
            ("close", close),
        ];
        for (name, cb) in functions {
            let bound = Bound {
                batched: Arc::clone(&batched),
                tsfn,
                settle: settle_ref,
            };
            raw::export_owned(env, store, name, cb, bound)?;
        }
        Ok(store)
    })
}

/// `open(env)`: resolves the settings against `env` (`process.env`), once.
unsafe extern "C" fn open(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let ([vars], data) = raw::args::<1>(env, info)?;
        let bound = &*data.cast::<Bound>();
        bound.batched.open(|name| read_var(env, vars, name));
        raw::undefined(env)
    })
}

/// One variable of `vars`, if it is a non-empty string.
unsafe fn read_var(env: sys::napi_env, vars: sys::napi_value, name: &str) -> Option<String> {
    let name = CString::new(name).ok()?;
    let mut value = ptr::null_mut();
    if sys::napi_get_named_property(env, vars, name.as_ptr(), &mut value) != sys::Status::napi_ok {
        return None;
    }
    let mut kind = sys::ValueType::napi_undefined;
    sys::napi_typeof(env, value, &mut kind);
    if kind != sys::ValueType::napi_string {
        return None;
    }
    raw::string(env, value, "").ok().filter(|s| !s.is_empty())
}

/// `send(id, key, windowMs, amount)`: queues a hit; throws if the store
/// can't take it (closed, or its settings failed).
unsafe extern "C" fn send(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let ([id, key, window_ms, amount], data) = raw::args::<4>(env, info)?;
        let bound = &*data.cast::<Bound>();
        let id = raw::number(env, id, "id must be a number")? as u32;
        let (window_ms, amount) = window::check(
            raw::number(env, window_ms, "windowMs must be a number")?,
            raw::number(env, amount, "amount must be a number")?,
        )?;
        raw::with_utf8(env, key, "key must be a string", |key| {
            bound.batched.send(id, key, window_ms, amount)
        })??;
        raw::undefined(env)
    })
}

/// `ref()`: a hit is in flight; keep the process and the callback alive.
unsafe extern "C" fn hold(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    set_held(env, info, true)
}

/// `unref()`: no hit is in flight any more.
unsafe extern "C" fn release(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    set_held(env, info, false)
}

unsafe fn set_held(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    held: bool,
) -> sys::napi_value {
    raw::guard(env, || {
        let (_, data) = raw::args::<0>(env, info)?;
        let bound = &*data.cast::<Bound>();
        let (tsfn, settle) = (bound.tsfn, bound.settle);
        if held {
            raw::check(sys::napi_ref_threadsafe_function(env, tsfn))?;
            raw::check(sys::napi_reference_ref(env, settle, ptr::null_mut()))?;
        } else {
            raw::check(sys::napi_unref_threadsafe_function(env, tsfn))?;
            raw::check(sys::napi_reference_unref(env, settle, ptr::null_mut()))?;
        }
        raw::undefined(env)
    })
}

/// `close()`: later hits are refused; the connection ends.
unsafe extern "C" fn close(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let (_, data) = raw::args::<0>(env, info)?;
        (*data.cast::<Bound>()).batched.close();
        raw::undefined(env)
    })
}

/// Runs on the JS thread when a batch is ready: hands it to `settle`.
unsafe extern "C" fn deliver(
    env: sys::napi_env,
    _js_callback: sys::napi_value,
    context: *mut c_void,
    _data: *mut c_void,
) {
    if env.is_null() {
        return; // The environment is being torn down.
    }
    let context = &mut *context.cast::<Context>();
    // No panic may cross into Node; a failed delivery leaves nothing to report to.
    let _ = catch_unwind(AssertUnwindSafe(|| deliver_batch(env, context)));
}

unsafe fn deliver_batch(env: sys::napi_env, context: &mut Context) -> Result<(), Error> {
    let Some(batched) = context.batched.upgrade() else {
        return Ok(());
    };
    batched.take(&mut context.scratch);
    let mut settle = ptr::null_mut();
    raw::check(sys::napi_get_reference_value(
        env,
        context.settle,
        &mut settle,
    ))?;
    if settle.is_null() {
        context.scratch.clear();
        return Ok(());
    }
    let results = std::slice::from_raw_parts_mut(context.results, 3 * BATCH);
    let mut n = 0;
    let mut errors: sys::napi_value = ptr::null_mut();
    let mut error_count = 0;
    for completion in context.scratch.drain(..) {
        match completion.result {
            Ok(hit) => {
                results[3 * n] = completion.id as f64;
                results[3 * n + 1] = hit.count as f64;
                results[3 * n + 2] = hit.reset_ms as f64;
                n += 1;
            }
            Err(e) => {
                if errors.is_null() {
                    raw::check(sys::napi_create_array(env, &mut errors))?;
                }
                raw::check(sys::napi_set_element(
                    env,
                    errors,
                    error_count,
                    raw::double(env, completion.id as f64)?,
                ))?;
                raw::check(sys::napi_set_element(
                    env,
                    errors,
                    error_count + 1,
                    raw::error(env, &e),
                ))?;
                error_count += 2;
            }
        }
        if n == BATCH {
            call_settle(env, settle, n, &mut errors)?;
            n = 0;
            error_count = 0;
        }
    }
    if n > 0 || !errors.is_null() {
        call_settle(env, settle, n, &mut errors)?;
    }
    Ok(())
}

unsafe fn call_settle(
    env: sys::napi_env,
    settle: sys::napi_value,
    n: usize,
    errors: &mut sys::napi_value,
) -> Result<(), Error> {
    let undefined = raw::undefined(env)?;
    let argv = [
        raw::double(env, n as f64)?,
        if errors.is_null() { undefined } else { *errors },
    ];
    *errors = ptr::null_mut();
    let mut ignored = ptr::null_mut();
    raw::check(sys::napi_call_function(
        env,
        undefined,
        settle,
        argv.len(),
        argv.as_ptr(),
        &mut ignored,
    ))
}

/// The threadsafe function is gone (released, or the environment is ending).
unsafe extern "C" fn finalize(env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    let context = Box::from_raw(data.cast::<Context>());
    context.slot.lock().take();
    sys::napi_delete_reference(env, context.settle);
    sys::napi_delete_reference(env, context.results_ref);
}
