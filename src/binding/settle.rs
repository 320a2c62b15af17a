//! How finished calls reach JavaScript, for every store and transport: one
//! `settle(n, errors, events)` call per batch of up to [`BATCH`]
//! completions, the numbers written into the store's shared results array
//! ([`STRIDE`] per answer: its id, then the answer's numbers), the errors as
//! `[id, error, ...]`, and the connection events.
//!
//! A store off the JS thread (redisStore's `Batched`, postgresStore and
//! mysqlStore on the I/O thread, sqliteStore on a thread of its own) hands
//! its completions to a core [`Delivery`], whose wake-up calls one
//! threadsafe function per store ([`delivery`]); the event-loop transport
//! calls [`settle_args`] from its own libuv callback.
//!
//! The threadsafe function is referenced only while calls are in flight
//! (JS calls `ref`/`unref`, see [`hold`]), so an idle store never keeps
//! Node.js alive and a pending call always does. The JS callback is held the
//! same way: weakly when idle, so a store nobody holds can be collected.
//! napi-rs' own threadsafe function holds its callback strongly for its
//! whole life, and the callback holds the store: a store nobody holds would
//! never be collected and never close its connection, so this one
//! threadsafe function is wired by hand.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use napi::bindgen_prelude::{Env, JsValue, Unknown, ValueType};
use napi::sys;

use super::{raw, throw_core};
use crate::delivery::{Completion, Delivery, Event};
use crate::errors::Error as CoreError;
use crate::ops::Answer;

/// The most completions one `settle` call hands over.
pub(super) const BATCH: usize = 1024;
/// Numbers per answer in the results array: the id, then the answer.
pub(super) const STRIDE: usize = 1 + crate::ops::ANSWER_LEN;

/// Checks that a store's `settle` is a function and takes a reference to
/// it, weak (strong only while calls are in flight, see [`hold`]), with the
/// results array its batches are written to. The caller owns the reference.
pub(super) fn callback(
    env: &Env,
    settle: &Unknown,
) -> napi::Result<(sys::napi_ref, Arc<raw::Numbers>)> {
    if settle.get_type()? != ValueType::Function {
        return Err(throw_core(
            env,
            CoreError::InvalidType("settle must be a function"),
        ));
    }
    let mut settle_ref = ptr::null_mut();
    // SAFETY: on the JS thread inside a #[napi] callback of `env`; a count
    // of 0 makes the reference weak.
    raw::check(env.raw(), unsafe {
        sys::napi_create_reference(env.raw(), settle.raw(), 0, &mut settle_ref)
    })
    .map_err(|e| throw_core(env, e))?;
    Ok((settle_ref, raw::Numbers::new(STRIDE * BATCH)))
}

/// Writes an answer's numbers into `results` from `at` on (a result's
/// place after its id).
pub(super) fn write_answer(results: &raw::Numbers, at: usize, answer: &Answer) {
    for (i, v) in answer.values.iter().enumerate() {
        results.set(at + i, *v as f64);
    }
}

/// The arguments of one `settle(n, errors, events)` call for the first
/// `count` completions, with the numbers written into `results`, and the
/// connection events (`[{ type, code? }]`, or undefined when none).
///
/// # Safety
/// Called on the JS thread inside a callback of `env`.
pub(super) unsafe fn settle_args(
    env: sys::napi_env,
    completions: &VecDeque<Completion>,
    count: usize,
    results: &raw::Numbers,
    events: &[Event],
) -> std::result::Result<[sys::napi_value; 3], CoreError> {
    let mut n = 0;
    let mut errors: sys::napi_value = ptr::null_mut();
    let mut error_count = 0;
    for completion in completions.iter().take(count) {
        match &completion.result {
            Ok(answer) => {
                results.set(STRIDE * n, f64::from(completion.id));
                write_answer(results, STRIDE * n + 1, answer);
                n += 1;
            }
            // SAFETY: as the caller promises; every handle is of this scope.
            Err(e) => unsafe {
                if errors.is_null() {
                    raw::check(env, sys::napi_create_array(env, &mut errors))?;
                }
                let id = raw::double(env, f64::from(completion.id))?;
                raw::check(env, sys::napi_set_element(env, errors, error_count, id))?;
                let error = raw::error(env, e)?;
                raw::check(
                    env,
                    sys::napi_set_element(env, errors, error_count + 1, error),
                )?;
                error_count += 2;
            },
        }
    }
    // SAFETY: as the caller promises.
    unsafe {
        let errors = match errors.is_null() {
            true => raw::undefined(env)?,
            false => errors,
        };
        let events = match events.is_empty() {
            true => raw::undefined(env)?,
            false => event_array(env, events)?,
        };
        Ok([raw::double(env, n as f64)?, errors, events])
    }
}

/// Deliveries in a row that may fail before the rest is given up (the
/// environment is then ending): each failure schedules another try.
const DELIVERY_TRIES: u32 = 8;

/// The threadsafe function, until it is released or finalized: never called after.
struct TsfnSlot(Mutex<Option<Tsfn>>);

struct Tsfn(sys::napi_threadsafe_function);

// SAFETY: Node-API allows calling and releasing a threadsafe function from
// any thread; the handle is only an opaque pointer to Node's own object.
unsafe impl Send for Tsfn {}

impl TsfnSlot {
    fn lock(&self) -> MutexGuard<'_, Option<Tsfn>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for `deliver` to run on the JS thread, if the function is alive.
    fn call(&self) {
        if let Some(tsfn) = &*self.lock() {
            // SAFETY: the slot holds the function only until it is released
            // (`Wake::drop`) or finalized (`finalize`), both under this lock.
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

/// The store's wake-up, owned by the core: releases the function when the
/// core drops it.
struct Wake(Arc<TsfnSlot>);

impl Drop for Wake {
    fn drop(&mut self) {
        if let Some(tsfn) = self.0.lock().take() {
            // SAFETY: as in `TsfnSlot::call`; taken out of the slot, so released once.
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
    delivery: Weak<Delivery>,
    slot: Arc<TsfnSlot>,
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
    scratch: Vec<Completion>,
    /// Finished hits not yet handed to JavaScript.
    pending: VecDeque<Completion>,
    /// Connection events not yet handed to JavaScript.
    events: Vec<Event>,
    failures: u32,
}

/// A store's [`Delivery`] and the threadsafe function its wake-up calls,
/// idle (unreferenced) until [`hold`]: `settle_ref`'s function gets the
/// completions, their numbers in `results`. On success the function's
/// context takes over `settle_ref` (deleted in `finalize`, once the delivery
/// is dropped, which releases the function); on an error it stays with the
/// caller. `name` names it in diagnostics.
///
/// # Safety
/// Called on the JS thread inside a callback of `env`; `settle_ref` is a
/// reference of `env`.
pub(super) unsafe fn delivery(
    env: sys::napi_env,
    name: &str,
    results: &Arc<raw::Numbers>,
    settle_ref: sys::napi_ref,
) -> std::result::Result<(Arc<Delivery>, sys::napi_threadsafe_function), CoreError> {
    let slot = Arc::new(TsfnSlot(Mutex::new(None)));
    let wake = Wake(Arc::clone(&slot));
    let delivery = Arc::new(Delivery::new(Box::new(move || wake.0.call())));
    let context = Box::into_raw(Box::new(Context {
        delivery: Arc::downgrade(&delivery),
        slot: Arc::clone(&slot),
        settle: settle_ref,
        results: Arc::clone(results),
        scratch: Vec::new(),
        pending: VecDeque::new(),
        events: Vec::new(),
        failures: 0,
    }));
    let mut tsfn = ptr::null_mut();
    // SAFETY: as the caller promises; `context` is handed to the threadsafe
    // function, which frees it in `finalize`.
    let created = unsafe {
        raw::js_string(env, name).and_then(|name| {
            raw::check(
                env,
                sys::napi_create_threadsafe_function(
                    env,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    name,
                    0,
                    1,
                    context.cast(),
                    Some(finalize),
                    context.cast(),
                    Some(deliver),
                    &mut tsfn,
                ),
            )
        })
    };
    if let Err(e) = created {
        // SAFETY: no threadsafe function took `context`: free it (the
        // reference stays with the caller, which deletes it).
        drop(unsafe { Box::from_raw(context) });
        return Err(e);
    }
    *slot.lock() = Some(Tsfn(tsfn));
    // Idle until a call is in flight.
    // SAFETY: `tsfn` was just made on this thread.
    if let Err(e) = raw::check(env, unsafe {
        sys::napi_unref_threadsafe_function(env, tsfn)
    }) {
        // The reference stays with the caller, as on every error: the
        // finalizer, which runs once `delivery` (dropped here) has released
        // the function, must not delete it too.
        // SAFETY: `context` lives until that finalizer, which can't run
        // before this callback returns (both are on the JS thread).
        unsafe { (*context).settle = ptr::null_mut() };
        return Err(e);
    }
    Ok((delivery, tsfn))
}

/// `ref()` (a call is in flight: keep the callback, and the process through
/// the threadsafe function, alive) or `unref()` (none is any more). The
/// event-loop transport has no threadsafe function: its armed timeout timer
/// keeps the process alive.
///
/// # Safety
/// Called on the JS thread inside a callback of `env`; `tsfn` and
/// `settle_ref` are alive (made on `env`, not yet released or deleted).
pub(super) unsafe fn hold(
    env: sys::napi_env,
    tsfn: Option<sys::napi_threadsafe_function>,
    settle_ref: sys::napi_ref,
    held: bool,
) -> std::result::Result<(), CoreError> {
    let mut count = 0;
    // SAFETY: as the caller promises.
    unsafe {
        if let Some(tsfn) = tsfn {
            raw::check(
                env,
                match held {
                    true => sys::napi_ref_threadsafe_function(env, tsfn),
                    false => sys::napi_unref_threadsafe_function(env, tsfn),
                },
            )?;
        }
        raw::check(
            env,
            match held {
                true => sys::napi_reference_ref(env, settle_ref, &mut count),
                false => sys::napi_reference_unref(env, settle_ref, &mut count),
            },
        )
    }
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
    // SAFETY: `context` is the Context given at creation, freed only by
    // `finalize`, which Node-API runs after the last call of this function;
    // only the JS thread touches it.
    let context = unsafe { &mut *context.cast::<Context>() };
    // No panic may cross into Node.
    // SAFETY: Node-API calls this on the JS thread with its env.
    let delivered = catch_unwind(AssertUnwindSafe(|| unsafe { deliver_all(env, context) }));
    if let Ok(Ok(true)) = delivered {
        context.failures = 0;
        return;
    }
    // Some results are still waiting: try again in a fresh callback, where
    // an exception JavaScript threw in this one is no longer pending.
    context.failures += 1;
    if context.failures <= DELIVERY_TRIES {
        context.slot.call();
    } else {
        context.pending.clear();
        context.events.clear();
    }
}

/// Hands every finished hit to `settle`, at most [`BATCH`] per call; false
/// if some are left for another try.
///
/// # Safety
/// Called on the JS thread inside the threadsafe function's callback.
unsafe fn deliver_all(
    env: sys::napi_env,
    context: &mut Context,
) -> std::result::Result<bool, CoreError> {
    let Some(delivery) = context.delivery.upgrade() else {
        context.pending.clear();
        context.events.clear();
        return Ok(true);
    };
    let mut events = Vec::new();
    delivery.take(&mut context.scratch, &mut events);
    drop(delivery);
    context.pending.extend(context.scratch.drain(..));
    context.events.append(&mut events);
    let mut settle = ptr::null_mut();
    // SAFETY: the reference lives until `finalize`.
    raw::check(env, unsafe {
        sys::napi_get_reference_value(env, context.settle, &mut settle)
    })?;
    if settle.is_null() {
        // The store was collected: nobody waits for these.
        context.pending.clear();
        context.events.clear();
        return Ok(true);
    }
    while !context.pending.is_empty() || !context.events.is_empty() {
        let mut pending = false;
        // SAFETY: a valid out-pointer.
        raw::check(env, unsafe {
            sys::napi_is_exception_pending(env, &mut pending)
        })?;
        if pending {
            // `settle` threw: nothing more can be called in this callback.
            return Ok(false);
        }
        let count = context.pending.len().min(BATCH);
        // SAFETY: as the caller promises.
        let (argv, this) = unsafe {
            (
                settle_args(
                    env,
                    &context.pending,
                    count,
                    &context.results,
                    &context.events,
                )?,
                raw::undefined(env)?,
            )
        };
        // Handed over from here: JavaScript settles them, or throws trying.
        context.pending.drain(..count);
        context.events.clear();
        let mut ignored = ptr::null_mut();
        // SAFETY: `settle` and `argv` are live handles of this scope. An
        // error means `settle` threw; the next turn of the loop sees it.
        unsafe {
            sys::napi_call_function(env, this, settle, argv.len(), argv.as_ptr(), &mut ignored)
        };
    }
    Ok(true)
}

/// The threadsafe function is gone (released, or the environment is ending).
unsafe extern "C" fn finalize(env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` is the Context given at creation; Node-API runs this
    // once, after the last `deliver`.
    let context = unsafe { Box::from_raw(data.cast::<Context>()) };
    context.slot.lock().take();
    if !context.settle.is_null() {
        // SAFETY: the reference was made on this env and is deleted only here.
        unsafe { sys::napi_delete_reference(env, context.settle) };
    }
}

/// `[{ type: 'connected' | 'lost' | 'reconnected', code? }]`: constant
/// text only, so no key or secret can be in it.
///
/// # Safety
/// Called on the JS thread inside a callback of `env`.
unsafe fn event_array(
    env: sys::napi_env,
    events: &[Event],
) -> std::result::Result<sys::napi_value, CoreError> {
    let mut array = ptr::null_mut();
    // SAFETY: as the caller promises; every handle is of this scope and
    // every property name a NUL-terminated literal.
    unsafe {
        raw::check(env, sys::napi_create_array(env, &mut array))?;
        for (i, event) in events.iter().enumerate() {
            let mut object = ptr::null_mut();
            raw::check(env, sys::napi_create_object(env, &mut object))?;
            let kind = raw::js_string(env, event.kind())?;
            raw::check(
                env,
                sys::napi_set_named_property(env, object, c"type".as_ptr(), kind),
            )?;
            if let Event::Lost(code) = event {
                let code = raw::js_string(env, code)?;
                raw::check(
                    env,
                    sys::napi_set_named_property(env, object, c"code".as_ptr(), code),
                )?;
            }
            raw::check(env, sys::napi_set_element(env, array, i as u32, object))?;
        }
    }
    Ok(array)
}
