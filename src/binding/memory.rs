//! memoryStore's binding. The hit runs on every request, so it is a raw
//! Node-API callback that takes one argument, the key, read into a stack
//! buffer. The numbers go both ways through a shared Float64Array, `hitIO`:
//! JavaScript leaves `[windowMs, amount]` there, the hit replaces them with
//! `[count, resetMs]`, and JavaScript builds the result object. No JS value
//! is read or made for a number (see "What a hit costs" in the README).

use std::ptr;
use std::sync::Arc;

use napi::sys;

use super::raw;
use crate::clock;
use crate::errors::Error;
use crate::memory::{self, Table};
use crate::window;

struct Bound {
    table: Arc<Table>,
    io: *mut f64,
}

pub unsafe fn register(env: sys::napi_env, exports: sys::napi_value) -> Result<(), Error> {
    let (array, data) = raw::float64_array(env, 2)?;
    raw::check(sys::napi_set_named_property(
        env,
        exports,
        c"hitIO".as_ptr(),
        array,
    ))?;
    // Held for the life of this environment: hit functions use it. Each
    // loaded copy of the module has its own array, passed to its functions
    // as their data (never through a per-thread global, which a second copy
    // loaded on the same thread would overwrite).
    let mut reference = ptr::null_mut();
    raw::check(sys::napi_create_reference(env, array, 1, &mut reference))?;
    raw::export(env, exports, "memoryStore", create, data.cast())?;
    raw::export(env, exports, "noopHit", noop_hit, data.cast())?;
    Ok(())
}

/// `memoryStore(maxKeys, name?)` → `{ hit, size }`, both bound to one table.
unsafe extern "C" fn create(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let ([max_keys, name], io) = raw::args::<2>(env, info)?;
        let io = io.cast::<f64>();
        let max_keys = raw::number(env, max_keys, "maxKeys must be a number")?;
        if !window::is_positive_safe_integer(max_keys) {
            return Err(Error::InvalidRange(
                "maxKeys must be a positive safe integer",
            ));
        }
        let name = raw::optional_string(env, name, "name must be a string")?;
        let table = memory::open(name.as_deref(), max_keys as usize)?;
        let mut store = ptr::null_mut();
        raw::check(sys::napi_create_object(env, &mut store))?;
        bind(env, store, "hit", hit, &table, io)?;
        bind(env, store, "size", size, &table, io)?;
        Ok(store)
    })
}

/// Adds `store[name]`, a function that owns a handle on the table.
unsafe fn bind(
    env: sys::napi_env,
    store: sys::napi_value,
    name: &str,
    cb: raw::Callback,
    table: &Arc<Table>,
    io: *mut f64,
) -> Result<(), Error> {
    let bound = Bound {
        table: Arc::clone(table),
        io,
    };
    raw::export_owned(env, store, name, cb, bound)
}

/// `hit(key)` with `hitIO = [windowMs, amount]` → undefined, `hitIO = [count, resetMs]`.
unsafe extern "C" fn hit(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let ([key], data) = raw::args::<1>(env, info)?;
        let bound = &*data.cast::<Bound>();
        let (window_ms, amount) = window::check(*bound.io, *bound.io.add(1))?;
        let table = &bound.table;
        let key = raw::with_utf16(env, key, "key must be a string", |k| table.key(k))?;
        let outcome = table.hit(key, clock::now_us, window_ms, amount)?;
        *bound.io = outcome.count as f64;
        *bound.io.add(1) = outcome.reset_ms as f64;
        Ok(ptr::null_mut())
    })
}

/// `size()` → counters held now.
unsafe extern "C" fn size(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    raw::guard(env, || {
        let (_, data) = raw::args::<0>(env, info)?;
        raw::double(env, (*data.cast::<Bound>()).table.len() as f64)
    })
}

/// The floor the benchmark reports: a native call that takes a hit's
/// arguments the same way (the key, and two numbers in `hitIO`) and does
/// nothing with them.
unsafe extern "C" fn noop_hit(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    raw::guard(env, || {
        let ([key], io) = raw::args::<1>(env, info)?;
        raw::with_utf16(env, key, "key must be a string", |k| k.len())?;
        let io = io.cast::<f64>();
        std::hint::black_box((*io, *io.add(1)));
        Ok(ptr::null_mut())
    })
}
