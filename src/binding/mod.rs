//! The N-API layer: converts arguments and results, nothing more. Functions
//! called rarely are `#[napi]`; the ones called on every hit are raw Node-API
//! callbacks (see `raw`), where the benchmark shows the difference.

mod memory;
mod mysql;
mod postgres;
mod raw;
mod redis;
mod redis_loop;
mod settle;
mod sqlite;
mod uv;

use napi::bindgen_prelude::*;
use napi::JsString;
use napi_derive::napi;

use crate::errors::Error as CoreError;

/// The version of the crate this binary was built from; the loader refuses a
/// binary whose version differs from the JS package's.
#[napi]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Throws the JS error for a core error from inside a `#[napi]` function,
/// and returns what tells napi-rs the exception is already pending. (If the
/// throw failed, napi-rs throws a plain Error with the same message.)
fn throw_core(env: &Env, err: CoreError) -> Error {
    // SAFETY: called on the JS thread inside a #[napi] callback of `env`.
    unsafe { raw::throw(env.raw(), &err) };
    Error::new(Status::PendingException, format!("ratestore: {err}"))
}

/// A string option that must be well-formed (no lone surrogates): a name or
/// prefix that lost a unit would be shared with another.
fn well_formed(value: JsString, what: &'static str) -> std::result::Result<String, CoreError> {
    // `as_str` refuses a lone surrogate (and leaves out the terminating NUL).
    value
        .into_utf16()
        .and_then(|units| units.as_str())
        .map_err(|_| CoreError::InvalidType(what))
}
