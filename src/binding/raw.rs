//! Small helpers over raw N-API calls, for the functions that skip the
//! `#[napi]` wrapper because they run on every hit.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use napi::sys;

use crate::errors::{Error, JsClass};

/// Keys up to this many UTF-16 units are read into a stack buffer.
const STACK_KEY: usize = 512;

pub type Callback = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;

pub fn check(status: sys::napi_status) -> Result<(), Error> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(Error::Internal("a Node-API call failed"))
    }
}

/// The arguments and the function's data pointer.
pub unsafe fn args<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> Result<([sys::napi_value; N], *mut c_void), Error> {
    let mut argv = [ptr::null_mut(); N];
    let mut argc = N;
    let mut data = ptr::null_mut();
    check(sys::napi_get_cb_info(
        env,
        info,
        &mut argc,
        argv.as_mut_ptr(),
        ptr::null_mut(),
        &mut data,
    ))?;
    if argc < N {
        // Missing arguments read as undefined, which the type checks refuse.
        let mut undefined = ptr::null_mut();
        check(sys::napi_get_undefined(env, &mut undefined))?;
        argv[argc..].fill(undefined);
    }
    Ok((argv, data))
}

pub unsafe fn number(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
) -> Result<f64, Error> {
    let mut n = 0.0;
    match sys::napi_get_value_double(env, value, &mut n) {
        sys::Status::napi_ok => Ok(n),
        _ => Err(Error::InvalidType(what)),
    }
}

/// Reads a string into a buffer the way `napi_get_value_string_utf8/16` do.
type Read<T> =
    unsafe fn(sys::napi_env, sys::napi_value, *mut T, usize, *mut usize) -> sys::napi_status;

/// Calls `f` with the string as read by `read`, without a heap allocation
/// for strings that fit in `STACK` units with `margin` to spare (a read that
/// fills the buffer may have been cut short).
unsafe fn with_string<T: Copy + Default, const STACK: usize, R>(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
    read: Read<T>,
    margin: usize,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R, Error> {
    // Left uninitialised: zeroing the buffer on every hit shows in a profile.
    let mut stack = [MaybeUninit::<T>::uninit(); STACK];
    let mut len = 0;
    if read(env, value, stack.as_mut_ptr().cast(), STACK, &mut len) != sys::Status::napi_ok {
        return Err(Error::InvalidType(what));
    }
    if len + margin < STACK {
        // SAFETY: Node-API wrote the first `len` units.
        return Ok(f(std::slice::from_raw_parts(stack.as_ptr().cast(), len)));
    }
    check(read(env, value, ptr::null_mut(), 0, &mut len))?;
    let mut heap = vec![T::default(); len + 1];
    check(read(env, value, heap.as_mut_ptr(), len + 1, &mut len))?;
    Ok(f(&heap[..len]))
}

/// Calls `f` with the string's UTF-16 units, without a heap allocation for
/// keys of ordinary length. UTF-16 is how V8 holds strings: no transcoding.
pub unsafe fn with_utf16<R>(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
    f: impl FnOnce(&[u16]) -> R,
) -> Result<R, Error> {
    unsafe fn read(
        e: sys::napi_env,
        v: sys::napi_value,
        b: *mut u16,
        n: usize,
        l: *mut usize,
    ) -> sys::napi_status {
        sys::napi_get_value_string_utf16(e, v, b, n, l)
    }
    with_string::<u16, STACK_KEY, R>(env, value, what, read, 1, f)
}

pub unsafe fn string(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
) -> Result<String, Error> {
    with_utf16(env, value, what, String::from_utf16_lossy)
}

pub unsafe fn is_undefined(env: sys::napi_env, value: sys::napi_value) -> Result<bool, Error> {
    let mut kind = sys::ValueType::napi_undefined;
    check(sys::napi_typeof(env, value, &mut kind))?;
    Ok(kind == sys::ValueType::napi_undefined)
}

/// A string, or `None` for undefined.
pub unsafe fn optional_string(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
) -> Result<Option<String>, Error> {
    if is_undefined(env, value)? {
        return Ok(None);
    }
    string(env, value, what).map(Some)
}

/// A boolean, or `None` for undefined.
pub unsafe fn optional_bool(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
) -> Result<Option<bool>, Error> {
    if is_undefined(env, value)? {
        return Ok(None);
    }
    let mut b = false;
    match sys::napi_get_value_bool(env, value, &mut b) {
        sys::Status::napi_ok => Ok(Some(b)),
        _ => Err(Error::InvalidType(what)),
    }
}

/// Calls `f` with the string as UTF-8 (lone surrogates become U+FFFD), without
/// a heap allocation for strings of ordinary length.
pub unsafe fn with_utf8<R>(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, Error> {
    unsafe fn read(
        e: sys::napi_env,
        v: sys::napi_value,
        b: *mut u8,
        n: usize,
        l: *mut usize,
    ) -> sys::napi_status {
        sys::napi_get_value_string_utf8(e, v, b.cast(), n, l)
    }
    // A UTF-8 character takes up to 4 bytes: a cut one leaves up to 3 free.
    with_string::<u8, { 3 * STACK_KEY }, R>(env, value, what, read, 4, f)
}

pub unsafe fn double(env: sys::napi_env, n: f64) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    check(sys::napi_create_double(env, n, &mut value))?;
    Ok(value)
}

pub unsafe fn undefined(env: sys::napi_env) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    check(sys::napi_get_undefined(env, &mut value))?;
    Ok(value)
}

/// A `Float64Array` of `len` numbers, and where its data lives. The caller
/// keeps the data alive by holding a reference to the array.
pub unsafe fn float64_array(
    env: sys::napi_env,
    len: usize,
) -> Result<(sys::napi_value, *mut f64), Error> {
    let mut data = ptr::null_mut();
    let mut buffer = ptr::null_mut();
    check(sys::napi_create_arraybuffer(
        env,
        len * 8,
        &mut data,
        &mut buffer,
    ))?;
    let mut array = ptr::null_mut();
    check(sys::napi_create_typedarray(
        env,
        sys::TypedarrayType::float64_array,
        len,
        buffer,
        0,
        &mut array,
    ))?;
    Ok((array, data.cast()))
}

pub unsafe fn js_string(env: sys::napi_env, s: &str) -> sys::napi_value {
    let mut value = ptr::null_mut();
    sys::napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut value);
    value
}

/// The JS error for `err`: its class, `code` and message. The one place a
/// core error becomes a JavaScript one.
pub unsafe fn error(env: sys::napi_env, err: &Error) -> sys::napi_value {
    let code = js_string(env, err.code());
    let message = js_string(env, &format!("ratestore: {err}"));
    let mut error = ptr::null_mut();
    match err.js_class() {
        JsClass::Error => sys::napi_create_error(env, code, message, &mut error),
        JsClass::TypeError => sys::napi_create_type_error(env, code, message, &mut error),
        JsClass::RangeError => sys::napi_create_range_error(env, code, message, &mut error),
    };
    error
}

/// Throws the JS error for `err`.
pub unsafe fn throw(env: sys::napi_env, err: &Error) {
    sys::napi_throw(env, error(env, err));
}

/// Runs a callback's body, turning an error or a panic into a thrown JS error:
/// no panic crosses into JavaScript.
pub unsafe fn guard(
    env: sys::napi_env,
    body: impl FnOnce() -> Result<sys::napi_value, Error>,
) -> sys::napi_value {
    let err = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(err)) => err,
        Err(_) => Error::Internal("a Rust panic was caught"),
    };
    throw(env, &err);
    ptr::null_mut()
}

/// Sets `target[name]` to a native function that owns `data` until the
/// function is garbage-collected.
pub unsafe fn export_owned<T>(
    env: sys::napi_env,
    target: sys::napi_value,
    name: &str,
    cb: Callback,
    data: T,
) -> Result<(), Error> {
    unsafe extern "C" fn drop_data<T>(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
        drop(Box::from_raw(data.cast::<T>()));
    }
    let data = Box::into_raw(Box::new(data));
    let func = match export(env, target, name, cb, data.cast()) {
        Ok(func) => func,
        Err(e) => {
            drop(Box::from_raw(data));
            return Err(e);
        }
    };
    check(sys::napi_add_finalizer(
        env,
        func,
        data.cast(),
        Some(drop_data::<T>),
        ptr::null_mut(),
        ptr::null_mut(),
    ))
}

/// Sets `exports[name]` to a native function with `data` as its data.
pub unsafe fn export(
    env: sys::napi_env,
    exports: sys::napi_value,
    name: &str,
    cb: Callback,
    data: *mut c_void,
) -> Result<sys::napi_value, Error> {
    let mut func = ptr::null_mut();
    check(sys::napi_create_function(
        env,
        name.as_ptr().cast(),
        name.len() as isize,
        Some(cb),
        data,
        &mut func,
    ))?;
    if !exports.is_null() {
        check(sys::napi_set_named_property(
            env,
            exports,
            format!("{name}\0").as_ptr().cast(),
            func,
        ))?;
    }
    Ok(func)
}
