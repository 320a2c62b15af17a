//! Raw Node-API for the calls the benchmark shows are worth it: the ones
//! made on every hit (memoryStore's `hit`, redisStore's `send`) and the
//! delivery of Redis results. Everything called rarely goes through napi-rs.
//!
//! Every function here takes the `napi_env` of the JavaScript thread it is
//! called on, from inside a Node-API callback (or a threadsafe function's
//! JS-thread callback), which is what Node-API requires of each call made
//! with it.

use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use napi::sys;

use crate::errors::{Error, JsClass};

/// Keys up to this many UTF-16 units are read into a stack buffer.
const STACK_KEY: usize = 512;

pub type Callback = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;

/// `Ok` for `napi_ok`; otherwise the error Node-API reports for the call,
/// with its own message.
#[inline]
pub fn check(env: sys::napi_env, status: sys::napi_status) -> Result<(), Error> {
    if status == sys::Status::napi_ok {
        return Ok(());
    }
    Err(failed(env, status))
}

/// The error of a Node-API call that failed: out of the hit's hot path.
#[cold]
#[inline(never)]
fn failed(env: sys::napi_env, status: sys::napi_status) -> Error {
    let mut info: *const sys::napi_extended_error_info = ptr::null();
    // SAFETY: `env` is the calling thread's environment (see the module
    // note) and `info` is a valid place for the pointer.
    let got = unsafe { sys::napi_get_last_error_info(env, &mut info) };
    // SAFETY: on success `info` points to a struct Node-API keeps until the
    // next call on this env; its message, if any, is a NUL-terminated string.
    // Both are read (and copied) before any other call.
    let message = unsafe {
        match (got, info.as_ref()) {
            (sys::Status::napi_ok, Some(info)) if !info.error_message.is_null() => {
                CStr::from_ptr(info.error_message)
                    .to_string_lossy()
                    .into_owned()
            }
            _ => format!("status {status}"),
        }
    };
    Error::NodeApi(message)
}

/// A callback's first `N` arguments (missing ones read as undefined) and the data
/// pointer its function was created with.
///
/// # Safety
/// `env` and `info` are those Node-API passed to the running callback.
pub unsafe fn args<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> Result<([sys::napi_value; N], *mut c_void), Error> {
    let mut argv = [ptr::null_mut(); N];
    let mut argc = N;
    let mut data = ptr::null_mut();
    // SAFETY: `argv` has room for `argc` values; the rest are valid out-pointers.
    let status = unsafe {
        sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            ptr::null_mut(),
            &mut data,
        )
    };
    // Node-API fills the places of missing arguments with undefined.
    check(env, status)?;
    Ok((argv, data))
}

/// A JS number as f64.
///
/// # Safety
/// `value` is a live handle of `env`'s current scope.
pub unsafe fn number(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
) -> Result<f64, Error> {
    let mut n = 0.0;
    // SAFETY: as the caller promises; `n` is a valid out-pointer.
    match unsafe { sys::napi_get_value_double(env, value, &mut n) } {
        sys::Status::napi_ok => Ok(n),
        _ => Err(Error::InvalidType(what)),
    }
}

/// Calls `f` with the string's UTF-16 code units, exactly as V8 holds them
/// (lone surrogates included: nothing is lost), without a heap allocation for
/// keys of ordinary length.
///
/// # Safety
/// `value` is a live handle of `env`'s current scope.
pub unsafe fn with_utf16<R>(
    env: sys::napi_env,
    value: sys::napi_value,
    what: &'static str,
    f: impl FnOnce(&[u16]) -> R,
) -> Result<R, Error> {
    // Left uninitialised: zeroing the buffer on every hit shows in a profile.
    let mut stack = [MaybeUninit::<u16>::uninit(); STACK_KEY];
    let mut len = 0;
    // SAFETY: the buffer has room for STACK_KEY units, terminator included.
    let read = unsafe {
        sys::napi_get_value_string_utf16(env, value, stack.as_mut_ptr().cast(), STACK_KEY, &mut len)
    };
    if read != sys::Status::napi_ok {
        return Err(Error::InvalidType(what));
    }
    if len + 1 < STACK_KEY {
        // SAFETY: Node-API wrote the first `len` units (the string was not
        // cut: it left room to spare), so they are initialised.
        let units = unsafe { std::slice::from_raw_parts(stack.as_ptr().cast::<u16>(), len) };
        return Ok(f(units));
    }
    // SAFETY: a null buffer asks for the length alone.
    check(env, unsafe {
        sys::napi_get_value_string_utf16(env, value, ptr::null_mut(), 0, &mut len)
    })?;
    let mut heap = vec![0u16; len + 1];
    // SAFETY: `heap` has room for `len + 1` units.
    check(env, unsafe {
        sys::napi_get_value_string_utf16(env, value, heap.as_mut_ptr(), len + 1, &mut len)
    })?;
    Ok(f(&heap[..len]))
}

/// A new JS number.
///
/// # Safety
/// Called inside a callback of `env` (a handle scope is open).
pub unsafe fn double(env: sys::napi_env, n: f64) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    // SAFETY: as the caller promises; `value` is a valid out-pointer.
    check(env, unsafe { sys::napi_create_double(env, n, &mut value) })?;
    Ok(value)
}

/// A JS boolean.
///
/// # Safety
/// Called inside a callback of `env`.
pub unsafe fn boolean(env: sys::napi_env, b: bool) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    // SAFETY: as the caller promises; `value` is a valid out-pointer.
    check(env, unsafe { sys::napi_get_boolean(env, b, &mut value) })?;
    Ok(value)
}

/// # Safety
/// Called inside a callback of `env`.
pub unsafe fn undefined(env: sys::napi_env) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    // SAFETY: as the caller promises; `value` is a valid out-pointer.
    check(env, unsafe { sys::napi_get_undefined(env, &mut value) })?;
    Ok(value)
}

/// A JS string.
///
/// # Safety
/// Called inside a callback of `env` (or with a handle scope open).
pub unsafe fn js_string(env: sys::napi_env, s: &str) -> Result<sys::napi_value, Error> {
    let mut value = ptr::null_mut();
    // SAFETY: `s` is valid UTF-8 of the length given; `value` is a valid out-pointer.
    check(env, unsafe {
        sys::napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut value)
    })?;
    Ok(value)
}

/// The JS error for `err`: its class, `code` and message. The one place a
/// core error becomes a JavaScript one.
///
/// # Safety
/// Called inside a callback of `env`.
pub unsafe fn error(env: sys::napi_env, err: &Error) -> Result<sys::napi_value, Error> {
    // SAFETY: as the caller promises.
    let (code, message) = unsafe {
        (
            js_string(env, err.code())?,
            js_string(env, &format!("ratestore: {err}"))?,
        )
    };
    let mut error = ptr::null_mut();
    // SAFETY: `code` and `message` are strings of this scope; `error` is a valid out-pointer.
    let status = unsafe {
        match err.js_class() {
            JsClass::Error => sys::napi_create_error(env, code, message, &mut error),
            JsClass::TypeError => sys::napi_create_type_error(env, code, message, &mut error),
            JsClass::RangeError => sys::napi_create_range_error(env, code, message, &mut error),
        }
    };
    check(env, status)?;
    // SAFETY: as the caller promises; `error` is a live handle of this scope.
    unsafe { set_sent(env, error, err) }?;
    Ok(error)
}

/// Gives the JS error of a hit's trip to Redis its `sent` property: whether
/// the hit left the process (and so may have counted).
///
/// # Safety
/// Called inside a callback of `env`, with `error` a live object of it.
unsafe fn set_sent(env: sys::napi_env, error: sys::napi_value, err: &Error) -> Result<(), Error> {
    let Some(sent) = err.sent() else {
        return Ok(());
    };
    // SAFETY: as the caller promises; the name is a NUL-terminated literal.
    check(env, unsafe {
        sys::napi_set_named_property(env, error, c"sent".as_ptr(), boolean(env, sent)?)
    })
}

/// Throws the JS error for `err`. Returns false if it could not be thrown
/// (the environment is being torn down): the caller must then not answer
/// as if it had succeeded.
///
/// # Safety
/// Called inside a callback of `env`.
pub unsafe fn throw(env: sys::napi_env, err: &Error) -> bool {
    // SAFETY: as the caller promises.
    match unsafe { error(env, err) } {
        // SAFETY: `error` is a live handle of this scope.
        Ok(error) => unsafe { sys::napi_throw(env, error) == sys::Status::napi_ok },
        Err(_) => false,
    }
}

/// Runs a callback's body, turning an error or a panic into a thrown JS
/// error: no panic crosses into JavaScript. A failed body returns null to
/// JavaScript (read there as undefined), so a callback whose success value
/// is never undefined tells failure from success even when the throw failed.
///
/// # Safety
/// Called inside a callback of `env`.
pub unsafe fn guard(
    env: sys::napi_env,
    body: impl FnOnce() -> Result<sys::napi_value, Error>,
) -> sys::napi_value {
    let err = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(err)) => err,
        Err(_) => Error::Internal("a Rust panic was caught"),
    };
    // SAFETY: as the caller promises.
    unsafe { throw(env, &err) };
    ptr::null_mut()
}

/// A native function that owns `data` until the function is
/// garbage-collected; `cb` receives it as its data pointer, a `*const T`.
///
/// # Safety
/// Called inside a callback of `env`; `cb` reads its data as a `T`.
pub unsafe fn function<T: 'static>(
    env: sys::napi_env,
    name: &str,
    cb: Callback,
    data: T,
) -> Result<sys::napi_value, Error> {
    unsafe extern "C" fn drop_data<T>(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
        // SAFETY: `data` is the Box made below, handed to this finalizer
        // alone, which Node-API runs once, after the function is unreachable.
        drop(unsafe { Box::from_raw(data.cast::<T>()) });
    }
    let data = Box::into_raw(Box::new(data));
    let mut func = ptr::null_mut();
    // SAFETY: `name` is valid UTF-8 of the length given; `data` stays valid
    // until the finalizer added next frees it.
    let created = check(env, unsafe {
        sys::napi_create_function(
            env,
            name.as_ptr().cast(),
            name.len() as isize,
            Some(cb),
            data.cast(),
            &mut func,
        )
    })
    .and_then(|()| {
        // SAFETY: `func` is the function just made; the finalizer owns `data` from here.
        check(env, unsafe {
            sys::napi_add_finalizer(
                env,
                func,
                data.cast(),
                Some(drop_data::<T>),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        })
    });
    if let Err(e) = created {
        // SAFETY: no finalizer took `data`, so it is still ours alone. (A
        // function made without its finalizer is never called: it is not
        // handed to JavaScript.)
        drop(unsafe { Box::from_raw(data) });
        return Err(e);
    }
    Ok(func)
}

/// Numbers that JavaScript and Rust exchange without a JS value per number:
/// a `Float64Array` over memory that Rust owns.
///
/// The memory is freed only when both sides are done with it: Rust holds it
/// by this `Arc`, and the ArrayBuffer's finalizer holds another. So whatever
/// JavaScript does with the buffer (transfer it, detach it, let it be
/// collected), Rust never reads or writes freed memory. Rust reaches the
/// numbers only through atomics, so even a buffer transferred to another
/// thread races with no undefined behaviour on the Rust side; a detached
/// array only stops JavaScript seeing the numbers.
pub struct Numbers(Box<[AtomicU64]>);

impl Numbers {
    pub fn new(len: usize) -> Arc<Numbers> {
        Arc::new(Numbers(
            (0..len)
                .map(|_| AtomicU64::new(f64::NAN.to_bits()))
                .collect(),
        ))
    }

    pub fn set(&self, i: usize, n: f64) {
        self.0[i].store(n.to_bits(), Ordering::Relaxed);
    }

    /// Reads a number and leaves NaN in its place, so a number is never read
    /// twice: a caller that could not write (a detached array) is noticed.
    /// A load and a store, not a swap: only the JS thread writes here, and
    /// a relaxed load and store are plain moves where a swap is a locked
    /// instruction, on every hit.
    pub fn take(&self, i: usize) -> f64 {
        let n = f64::from_bits(self.0[i].load(Ordering::Relaxed));
        self.0[i].store(f64::NAN.to_bits(), Ordering::Relaxed);
        n
    }

    /// The numbers as a `Float64Array` for JavaScript.
    ///
    /// # Safety
    /// Called inside a callback of `env`.
    pub unsafe fn array(self: &Arc<Self>, env: sys::napi_env) -> Result<sys::napi_value, Error> {
        unsafe extern "C" fn release(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
            // SAFETY: `hint` is the Box made below, given to this finalizer alone.
            drop(unsafe { Box::from_raw(hint.cast::<Arc<Numbers>>()) });
        }
        let len = self.0.len();
        // AtomicU64 has u64's size and alignment, so the memory is `len` f64s
        // as a Float64Array reads them.
        let data = self.0.as_ptr().cast_mut().cast::<c_void>();
        let hint = Box::into_raw(Box::new(Arc::clone(self)));
        let mut buffer = ptr::null_mut();
        // SAFETY: `data` stays valid while `hint`'s Arc lives, which the
        // finalizer drops only once V8 is done with the buffer.
        let status = unsafe {
            sys::napi_create_external_arraybuffer(
                env,
                data,
                len * 8,
                Some(release),
                hint.cast(),
                &mut buffer,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: no finalizer took `hint`.
            drop(unsafe { Box::from_raw(hint) });
            if status == sys::Status::napi_no_external_buffers_allowed {
                return Err(Error::Unsupported(
                    "this JavaScript runtime does not allow external ArrayBuffers",
                ));
            }
            return check(env, status).map(|()| ptr::null_mut());
        }
        let mut array = ptr::null_mut();
        // SAFETY: `buffer` is the ArrayBuffer just made, `len * 8` bytes long.
        check(env, unsafe {
            sys::napi_create_typedarray(
                env,
                sys::TypedarrayType::float64_array,
                len,
                buffer,
                0,
                &mut array,
            )
        })?;
        Ok(array)
    }
}
