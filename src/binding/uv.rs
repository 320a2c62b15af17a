//! The few libuv functions redisStore's event-loop transport uses: a poll
//! handle on the connection's socket, a timer for timeouts, and an async
//! handle that a connect thread wakes. Node.js exports libuv from its own
//! binary; the functions are looked up there once, at run time, so the
//! addon links against nothing (as napi-rs does for Node-API itself).
//!
//! Handles are allocated here, sized by `uv_handle_size`, and freed in
//! their close callback. Every call must be made on the thread of the loop
//! the handle belongs to: the JS thread of one environment (only
//! `uv_async_send` may be called from any thread).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::errors::Error;

pub type Loop = napi::sys::uv_loop_s;
/// Any libuv handle (poll, timer, async).
#[repr(C)]
pub struct Handle {
    _opaque: [u8; 0],
}

pub type PollCb = unsafe extern "C" fn(*mut Handle, c_int, c_int);
pub type TimerCb = unsafe extern "C" fn(*mut Handle);
pub type AsyncCb = unsafe extern "C" fn(*mut Handle);
pub type CloseCb = unsafe extern "C" fn(*mut Handle);

pub const READABLE: c_int = 1;
pub const WRITABLE: c_int = 2;
const UV_ASYNC: c_int = 1;
const UV_POLL: c_int = 8;
const UV_TIMER: c_int = 13;

#[cfg(unix)]
pub type UvSocket = c_int;
#[cfg(windows)]
pub type UvSocket = usize;

/// libuv's functions, as Node exports them.
pub struct Uv {
    handle_size: unsafe extern "C" fn(c_int) -> usize,
    poll_init_socket: unsafe extern "C" fn(*mut Loop, *mut Handle, UvSocket) -> c_int,
    poll_start: unsafe extern "C" fn(*mut Handle, c_int, PollCb) -> c_int,
    timer_init: unsafe extern "C" fn(*mut Loop, *mut Handle) -> c_int,
    timer_start: unsafe extern "C" fn(*mut Handle, TimerCb, u64, u64) -> c_int,
    timer_stop: unsafe extern "C" fn(*mut Handle) -> c_int,
    async_init: unsafe extern "C" fn(*mut Loop, *mut Handle, AsyncCb) -> c_int,
    async_send: unsafe extern "C" fn(*mut Handle) -> c_int,
    close: unsafe extern "C" fn(*mut Handle, CloseCb),
    unref: unsafe extern "C" fn(*mut Handle),
    set_data: unsafe extern "C" fn(*mut Handle, *mut c_void),
    get_data: unsafe extern "C" fn(*const Handle) -> *mut c_void,
}

/// libuv, looked up once in the running process.
pub fn uv() -> Result<&'static Uv, Error> {
    static UV: OnceLock<Option<Uv>> = OnceLock::new();
    UV.get_or_init(load).as_ref().ok_or(Error::Unsupported(
        "this JavaScript runtime does not export libuv, which redisStore's transport needs",
    ))
}

fn load() -> Option<Uv> {
    #[cfg(unix)]
    let this = libloading::os::unix::Library::this();
    #[cfg(windows)]
    let this = libloading::os::windows::Library::this().ok()?;
    macro_rules! get {
        ($name:literal) => {
            // SAFETY: each symbol is looked up by its libuv name and given
            // the type libuv declares for it (uv.h, stable since 1.19).
            *unsafe { this.get($name) }.ok()?
        };
    }
    Some(Uv {
        handle_size: get!(b"uv_handle_size\0"),
        poll_init_socket: get!(b"uv_poll_init_socket\0"),
        poll_start: get!(b"uv_poll_start\0"),
        timer_init: get!(b"uv_timer_init\0"),
        timer_start: get!(b"uv_timer_start\0"),
        timer_stop: get!(b"uv_timer_stop\0"),
        async_init: get!(b"uv_async_init\0"),
        async_send: get!(b"uv_async_send\0"),
        close: get!(b"uv_close\0"),
        unref: get!(b"uv_unref\0"),
        set_data: get!(b"uv_handle_set_data\0"),
        get_data: get!(b"uv_handle_get_data\0"),
    })
}

/// Words (u64, which keeps every field libuv puts in a handle aligned) in
/// the memory of every handle here: enough for the largest of the three
/// kinds, so that `free` needs no record of the kind.
fn words(uv: &Uv) -> usize {
    static WORDS: OnceLock<usize> = OnceLock::new();
    *WORDS.get_or_init(|| {
        [UV_ASYNC, UV_POLL, UV_TIMER]
            .into_iter()
            // SAFETY: uv_handle_size is a pure function of the handle type.
            .map(|kind| unsafe { (uv.handle_size)(kind) })
            .max()
            .unwrap_or(0)
            .div_ceil(8)
    })
}

/// Frees a handle's memory once libuv has closed it.
unsafe extern "C" fn free(handle: *mut Handle) {
    let Ok(uv) = uv() else { return };
    let words = std::ptr::slice_from_raw_parts_mut(handle.cast::<u64>(), words(uv));
    // SAFETY: called once libuv has closed the handle (or it was never
    // initialised), so nothing uses it any more; it was made by `make`.
    drop(unsafe { Box::from_raw(words) });
}

/// A handle made here, with its `data` set.
pub struct Made(pub *mut Handle);

impl Uv {
    fn make(&self, data: *mut c_void) -> *mut Handle {
        let handle: *mut Handle = Box::into_raw(vec![0u64; words(self)].into_boxed_slice()).cast();
        // SAFETY: `handle` is live memory of a handle's size; uv_handle_set_data
        // only stores the pointer in the handle's public `data` field.
        unsafe { (self.set_data)(handle, data) };
        handle
    }

    /// A poll handle on `socket`, not referencing the loop.
    ///
    /// # Safety
    /// On the loop's thread; `socket` stays open until the handle is closed.
    pub unsafe fn poll(
        &self,
        lp: *mut Loop,
        socket: UvSocket,
        data: *mut c_void,
    ) -> Result<Made, Error> {
        let handle = self.make(data);
        // SAFETY: as the caller promises.
        let status = unsafe { (self.poll_init_socket)(lp, handle, socket) };
        if status != 0 {
            // SAFETY: an uninitialised handle was never given to libuv.
            unsafe { free(handle) };
            return Err(Error::Connection {
                text: format!("the event loop refused the socket (libuv error {status})"),
                sent: false,
            });
        }
        // SAFETY: an initialised handle of this loop.
        unsafe { (self.unref)(handle) };
        Ok(Made(handle))
    }

    /// # Safety
    /// On the loop's thread; `handle` is a live poll handle.
    pub unsafe fn poll_start(&self, handle: *mut Handle, events: c_int, cb: PollCb) -> c_int {
        // SAFETY: as the caller promises.
        unsafe { (self.poll_start)(handle, events, cb) }
    }

    /// A timer; an armed one keeps the loop (and the process) alive.
    ///
    /// # Safety
    /// On the loop's thread.
    pub unsafe fn timer(&self, lp: *mut Loop, data: *mut c_void) -> Result<Made, Error> {
        let handle = self.make(data);
        // SAFETY: as the caller promises; the handle's memory is live.
        if unsafe { (self.timer_init)(lp, handle) } != 0 {
            // SAFETY: never initialised.
            unsafe { free(handle) };
            return Err(Error::Internal("could not make a timer"));
        }
        Ok(Made(handle))
    }

    /// # Safety
    /// On the loop's thread; `handle` is a live timer.
    pub unsafe fn timer_start(&self, handle: *mut Handle, cb: TimerCb, ms: u64) {
        // SAFETY: as the caller promises.
        unsafe { (self.timer_start)(handle, cb, ms, 0) };
    }

    /// # Safety
    /// As `timer_start`.
    pub unsafe fn timer_stop(&self, handle: *mut Handle) {
        // SAFETY: as the caller promises.
        unsafe { (self.timer_stop)(handle) };
    }

    /// An async handle, not referencing the loop.
    ///
    /// # Safety
    /// On the loop's thread.
    pub unsafe fn wakeup(
        &self,
        lp: *mut Loop,
        data: *mut c_void,
        cb: AsyncCb,
    ) -> Result<Made, Error> {
        let handle = self.make(data);
        // SAFETY: as the caller promises; the handle's memory is live.
        if unsafe { (self.async_init)(lp, handle, cb) } != 0 {
            // SAFETY: never initialised.
            unsafe { free(handle) };
            return Err(Error::Internal("could not make an async handle"));
        }
        // SAFETY: an initialised handle of this loop.
        unsafe { (self.unref)(handle) };
        Ok(Made(handle))
    }

    /// Wakes the loop of an async handle; any thread may call it.
    ///
    /// # Safety
    /// `handle` is a live async handle (not yet closed).
    pub unsafe fn wake(&self, handle: *mut Handle) {
        // SAFETY: as the caller promises.
        unsafe { (self.async_send)(handle) };
    }

    /// The `data` pointer of a handle.
    ///
    /// # Safety
    /// `handle` is a live handle made here.
    pub unsafe fn data(&self, handle: *mut Handle) -> *mut c_void {
        // SAFETY: as the caller promises.
        unsafe { (self.get_data)(handle) }
    }

    /// Closes a handle; its memory is freed once libuv is done with it.
    ///
    /// # Safety
    /// On the loop's thread; `handle` is live and is not used after.
    pub unsafe fn close(&self, handle: *mut Handle) {
        // SAFETY: as the caller promises.
        unsafe { (self.close)(handle, free) };
    }
}
