//! The N-API layer: converts arguments and results, nothing more.

mod memory;
mod raw;
mod redis;

use napi::bindgen_prelude::*;
use napi_derive::napi;

#[napi(module_exports)]
pub fn exports(exports: Object, env: Env) -> Result<()> {
    // SAFETY: called by napi-rs on the JS thread with this env's exports object.
    unsafe {
        memory::register(env.raw(), exports.raw())
            .and_then(|()| redis::register(env.raw(), exports.raw()))
            .map_err(|e| Error::from_reason(e.to_string()))
    }
}

/// The version of the crate this binary was built from; the loader refuses a
/// binary whose version differs from the JS package's.
#[napi]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
