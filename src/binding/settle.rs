//! How finished calls reach JavaScript, on every transport: one
//! `settle(n, errors, events)` call per batch of up to [`BATCH`]
//! completions, the numbers written into the store's shared results array
//! ([`STRIDE`] per answer: its id, then the answer's numbers), the errors as
//! `[id, error, ...]`, and the connection events.

use std::collections::VecDeque;
use std::ptr;

use napi::sys;

use super::raw;
use crate::errors::Error as CoreError;
use crate::redis::stats::Event;
use crate::redis::Completion;

/// The most completions one `settle` call hands over.
pub(super) const BATCH: usize = 1024;
/// Numbers per answer in the results array: the id, then the answer.
pub(super) const STRIDE: usize = 1 + crate::ops::ANSWER_LEN;

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
                for (i, v) in answer.values.iter().enumerate() {
                    results.set(STRIDE * n + 1 + i, *v as f64);
                }
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
