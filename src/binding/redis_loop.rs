//! redisStore on one server, run on Node's own event loop: a hit is
//! encoded and written from the JS thread, the socket is watched by a libuv
//! poll handle, and a reply settles its hit's promise in the callback that
//! read it. No thread is crossed per hit, and an idle store has nothing to
//! wake: only a connect runs on a thread of its own (blocking DNS, TCP,
//! TLS handshake, AUTH and SELECT), which wakes the loop when it is done.
//!
//! Stores of one JS thread with the same server and credentials share one
//! connection (`LoopConn`): a store made per request by mistake then costs no
//! connect (nor TLS handshake) per hit. Each store keeps its own callback
//! (`Sink`) and prefix.
//!
//! Everything here runs on the JS thread of one environment but the
//! connect thread, which touches only its `Connecting` slot.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use napi::sys;

use super::raw;
use super::settle::{settle_args, BATCH};
use super::uv::{self, Handle, Uv};
use crate::delivery::Completion;
use crate::errors::Error;
use crate::ops::{Args, Op};
use crate::redis::conn::{self, Io};
use crate::redis::pipe::{Request, Route};
use crate::redis::resp::Parser;
use crate::redis::socket::{self, Socket, Target};
use crate::redis::stats::{self, Event};
use crate::redis::step;
use crate::redis::Config;
use crate::wtf8;

/// Where a connect thread leaves its socket, and how it wakes the loop.
struct Connecting {
    result: Option<Result<Socket, Error>>,
    /// The async handle to wake; None once the connection is torn down.
    wake: Option<WakeHandle>,
}

struct WakeHandle(*mut Handle);
// SAFETY: the handle is only passed to `uv_async_send`, which libuv allows
// from any thread, and only while the slot's lock shows it is still open.
unsafe impl Send for WakeHandle {}

/// Where one store's results go: its `settle` and its numbers array.
struct To {
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
}

/// The connection's host on Node's event loop: libuv handles for the
/// socket, the deadline and the connect thread's wake-up.
struct UvIo {
    env: sys::napi_env,
    uv: &'static Uv,
    lp: *mut uv::Loop,
    async_context: sys::napi_async_context,
    connecting: Arc<Mutex<Connecting>>,
    timer: *mut Handle,
    wakeup: *mut Handle,
    /// The socket's poll handle while a connection is up.
    poll: *mut Handle,
    /// The socket, while a connection is up.
    socket: Option<Box<Socket>>,
    /// The address of the RefCell the connection lives in: every handle's data.
    cell: *mut c_void,
}

type LoopConn = conn::Conn<UvIo, To>;
type SharedConn = Rc<RefCell<LoopConn>>;

thread_local! {
    /// This thread's connections, by what they connect to.
    static CONNS: RefCell<Vec<Weak<RefCell<LoopConn>>>> = const { RefCell::new(Vec::new()) };
}

impl Io for UvIo {
    type Socket = Socket;

    /// Connects on a thread of its own, which wakes the loop when done.
    fn connect(&mut self, target: Arc<Target>, timeout: Duration) -> Result<(), Error> {
        let slot = Arc::clone(&self.connecting);
        std::thread::Builder::new()
            .name("ratestore-redis-connect".into())
            .spawn(move || {
                let result = target.connect(timeout);
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                slot.result = Some(result);
                if let (Some(wake), Ok(uv)) = (&slot.wake, uv::uv()) {
                    // SAFETY: the handle is open while the slot holds it
                    // (teardown takes it out under this lock before closing).
                    unsafe { uv.wake(wake.0) };
                }
            })
            .map(|_| ())
            .map_err(|_| Error::Internal("could not start a connect thread"))
    }

    fn open(&mut self, socket: Socket) -> Result<(), Error> {
        // SAFETY: on the loop's thread; the socket stays open as long as the
        // handle (`close` closes the handle before dropping it).
        let poll = unsafe {
            self.uv
                .poll(self.lp, socket.raw() as uv::UvSocket, self.cell)?
        };
        self.poll = poll.0;
        self.socket = Some(Box::new(socket));
        Ok(())
    }

    fn watch(&mut self, writing: bool) -> bool {
        if self.poll.is_null() {
            return false;
        }
        let events = uv::READABLE | if writing { uv::WRITABLE } else { 0 };
        // SAFETY: on the loop's thread; `poll` is the live handle of this connection.
        unsafe { self.uv.poll_start(self.poll, events, on_ready) == 0 }
    }

    fn read(&mut self, parser: &mut Parser) -> std::io::Result<bool> {
        socket::held(&mut self.socket)?.read(parser)
    }

    fn write(&mut self, out: &mut Vec<u8>) -> std::io::Result<bool> {
        socket::held(&mut self.socket)?.write(out)
    }

    fn close(&mut self) {
        let poll = std::mem::replace(&mut self.poll, ptr::null_mut());
        if !poll.is_null() {
            // SAFETY: on the loop's thread; the handle is not used after.
            // libuv allows closing the socket right after uv_close.
            unsafe { self.uv.close(poll) };
        }
        self.socket = None;
    }

    fn arm(&mut self, at: Option<Instant>) {
        if self.timer.is_null() {
            return;
        }
        // SAFETY: on the loop's thread; the timer is live until teardown.
        unsafe {
            match at {
                Some(at) => {
                    let ms = at.saturating_duration_since(Instant::now()).as_millis() as u64 + 1;
                    self.uv.timer_start(self.timer, on_timer, ms);
                }
                None => self.uv.timer_stop(self.timer),
            }
        }
    }

    fn teardown(&mut self) {
        self.close();
        self.connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake = None;
        let handles = [
            std::mem::replace(&mut self.timer, ptr::null_mut()),
            std::mem::replace(&mut self.wakeup, ptr::null_mut()),
        ];
        for handle in handles.into_iter().filter(|h| !h.is_null()) {
            // SAFETY: on the loop's thread; the handles are live and not used after.
            unsafe { self.uv.close(handle) };
        }
    }
}

impl Drop for UvIo {
    fn drop(&mut self) {
        self.teardown();
        // SAFETY: the async context was made on this env's thread, where the
        // last store of the connection lets it go.
        unsafe { sys::napi_async_destroy(self.env, self.async_context) };
    }
}

/// One store on a (possibly shared) connection.
pub struct LoopStore {
    conn: SharedConn,
    sink: usize,
    prefix: Vec<u8>,
    timeout: Duration,
}

impl LoopStore {
    /// A store for `config`, on the loop of `env`: on this thread's
    /// connection to the same server if there is one.
    ///
    /// # Safety
    /// On the JS thread inside a callback of `env`; `settle` is a reference
    /// of `env` that outlives the store (it is deleted by the caller after
    /// dropping it).
    pub unsafe fn open(
        env: sys::napi_env,
        config: &Config,
        prefix: Vec<u8>,
        settle: sys::napi_ref,
        results: Arc<raw::Numbers>,
    ) -> Result<LoopStore, Error> {
        // Every setting must match (the prefix is not one; timeoutMs is, as
        // it bounds the connect too).
        let key = config.clone();
        let found = CONNS.with(|conns| {
            let mut conns = conns.borrow_mut();
            conns.retain(|c| c.strong_count() > 0);
            conns
                .iter()
                .filter_map(Weak::upgrade)
                .find(|c| c.borrow().key == key && !c.borrow().torn_down())
        });
        let conn = match found {
            Some(conn) => conn,
            None => {
                // SAFETY: as the caller promises.
                let conn = unsafe { open_conn(env, config, key)? };
                CONNS.with(|conns| conns.borrow_mut().push(Rc::downgrade(&conn)));
                conn
            }
        };
        let sink = conn.borrow_mut().join(To { settle, results });
        Ok(LoopStore {
            conn,
            sink,
            prefix,
            timeout: Duration::from_millis(config.timeout_ms),
        })
    }

    /// Queues an op on `key` (UTF-16 code units, sent as WTF-8).
    pub fn send(&self, id: u32, op: Op, args: Args, key: &[u16]) -> Result<(), Error> {
        let suffix = op.suffix(&args);
        let mut full = Vec::with_capacity(self.prefix.len() + key.len() + suffix.len());
        full.extend_from_slice(&self.prefix);
        wtf8::extend(&mut full, key);
        full.extend_from_slice(suffix);
        let now = Instant::now();
        let request = Request {
            id: (self.sink as u64) << 32 | u64::from(id),
            op,
            args,
            key: full.into_boxed_slice(),
            sent_at: now,
            deadline: now + self.timeout,
            route: Route::Direct,
        };
        self.conn.borrow_mut().send(self.sink, request)
    }

    /// Queues several takes as one step (see [`crate::redis::step`]): each op,
    /// its numbers and its key (UTF-16 code units, sent as WTF-8).
    pub fn send_takes(&self, id: u32, takes: &[(Op, Args, &[u16])]) -> Result<(), Error> {
        let mut blob = Vec::new();
        for (op, args, key) in takes {
            step::push(&mut blob, *op, args, |b| {
                b.extend_from_slice(&self.prefix);
                wtf8::extend(b, key);
            });
        }
        let now = Instant::now();
        let request = Request {
            id: (self.sink as u64) << 32 | u64::from(id),
            op: Op::Takes,
            args: [0; 4],
            key: blob.into_boxed_slice(),
            sent_at: now,
            deadline: now + self.timeout,
            route: Route::Direct,
        };
        self.conn.borrow_mut().send(self.sink, request)
    }

    pub fn flush(&self) {
        self.conn.borrow_mut().flush(Instant::now());
        deliver(&self.conn);
    }

    /// The connection's counts (see `stats::Tally::numbers`), shared by the
    /// stores of this thread on it.
    pub fn stats(&self) -> [f64; stats::NUMBERS] {
        self.conn.borrow().pipe.tally.numbers()
    }

    /// Refuses later hits; the store lets go of the connection once its hits
    /// in flight settle.
    pub fn close(&self) {
        self.conn.borrow_mut().close(self.sink);
    }
}

impl Drop for LoopStore {
    fn drop(&mut self) {
        // Nobody waits for this store's results any more: the connection
        // (if no other store uses it) ends with the store.
        self.conn.borrow_mut().leave(self.sink);
    }
}

/// A connection on the loop of `env`, with its timer and wake-up handles.
///
/// # Safety
/// On the JS thread inside a callback of `env`.
unsafe fn open_conn(env: sys::napi_env, config: &Config, key: Config) -> Result<SharedConn, Error> {
    let uv = uv::uv()?;
    let mut lp = ptr::null_mut();
    // SAFETY: as the caller promises.
    raw::check(env, unsafe { sys::napi_get_uv_event_loop(env, &mut lp) })?;
    let mut async_context = ptr::null_mut();
    // SAFETY: as the caller promises; the name is a string of this scope.
    unsafe {
        let name = raw::js_string(env, "ratestore.redisStore")?;
        raw::check(
            env,
            sys::napi_async_init(env, ptr::null_mut(), name, &mut async_context),
        )?;
    }
    let io = UvIo {
        env,
        uv,
        lp,
        async_context,
        connecting: Arc::new(Mutex::new(Connecting {
            result: None,
            wake: None,
        })),
        timer: ptr::null_mut(),
        wakeup: ptr::null_mut(),
        poll: ptr::null_mut(),
        socket: None,
        cell: ptr::null_mut(),
    };
    let conn = Rc::new(RefCell::new(conn::Conn::new(
        config,
        key,
        io,
        rand::random(),
    )?));
    let data = Rc::as_ptr(&conn).cast_mut().cast::<c_void>();
    // SAFETY: on the loop's thread; each handle's data is the connection,
    // which outlives them: its teardown closes them before it is dropped.
    unsafe {
        let timer = uv.timer(lp, data)?;
        let wakeup = uv
            .wakeup(lp, data, on_connected)
            .inspect_err(|_| uv.close(timer.0))?;
        let mut c = conn.borrow_mut();
        let io = &mut c.io;
        io.cell = data;
        io.timer = timer.0;
        io.wakeup = wakeup.0;
        io.connecting.lock().unwrap_or_else(|e| e.into_inner()).wake = Some(WakeHandle(wakeup.0));
    }
    Ok(conn)
}

/// Runs `f` on the connection behind a handle, then hands what finished to
/// JavaScript, with no borrow held while JavaScript runs (it may send hits
/// or close stores).
///
/// # Safety
/// `handle` is a live handle made by `open_conn` or `UvIo::open`.
unsafe fn with_conn(handle: *mut Handle, f: impl FnOnce(&mut LoopConn)) {
    let Ok(uv) = uv::uv() else { return };
    // SAFETY: the data is the RefCell's address inside the connection's Rc,
    // which outlives its handles (teardown closes them first, and runs
    // before the Rc's memory goes); libuv calls back on the JS thread.
    let cell = unsafe { &*uv.data(handle).cast::<RefCell<LoopConn>>() };
    {
        let Ok(mut conn) = cell.try_borrow_mut() else {
            return; // Reentered: the outer call delivers.
        };
        // No panic may cross into libuv.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut conn))).is_err() {
            conn.lost("a Rust panic was caught", Instant::now());
        }
    }
    deliver(cell);
}

unsafe extern "C" fn on_ready(handle: *mut Handle, status: i32, events: i32) {
    // SAFETY: libuv passes the poll handle made in `UvIo::open`.
    unsafe {
        with_conn(handle, |c| match status < 0 {
            true => c.lost(&format!("libuv error {status}"), Instant::now()),
            false => c.ready(
                events & uv::READABLE != 0,
                events & uv::WRITABLE != 0,
                Instant::now(),
            ),
        })
    }
}

unsafe extern "C" fn on_timer(handle: *mut Handle) {
    // SAFETY: libuv passes the timer made in `open_conn`.
    unsafe { with_conn(handle, |c| c.handle_timeout(Instant::now())) }
}

unsafe extern "C" fn on_connected(handle: *mut Handle) {
    // SAFETY: libuv passes the async handle made in `open_conn`.
    unsafe {
        with_conn(handle, |c| {
            let result =
                c.io.connecting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .result
                    .take();
            if let Some(result) = result {
                c.connected(result, Instant::now());
            }
        })
    }
}

/// Hands every finished hit to its store's `settle`, then re-arms the timer
/// and lets closed stores go once their hits have settled.
fn deliver(cell: &RefCell<LoopConn>) {
    loop {
        let (env, context, settle, results, done, events) = {
            let Ok(mut c) = cell.try_borrow_mut() else {
                return;
            };
            c.route();
            let next = c
                .sinks
                .iter_mut()
                .flatten()
                .find(|s| !s.done.is_empty() || !s.events.is_empty());
            let Some(sink) = next else {
                c.arm();
                c.release_idle();
                return;
            };
            let count = sink.done.len().min(BATCH);
            let done: VecDeque<Completion> = sink.done.drain(..count).collect();
            let events = std::mem::take(&mut sink.events);
            let (settle, results) = (sink.to.settle, Arc::clone(&sink.to.results));
            (c.io.env, c.io.async_context, settle, results, done, events)
        };
        // SAFETY: on the JS thread, outside any other Node-API call (a libuv
        // callback, or the tail of a store function's call); the sink's
        // reference outlives the sink (its store deletes it after).
        unsafe { call_settle(env, context, settle, &results, &done, &events) };
    }
}

/// Calls `settle(n, errors, events)` for `done` in a scope of its own, as libuv
/// callbacks must (microtasks run when it ends); an exception it throws is
/// reported as uncaught.
///
/// # Safety
/// On the JS thread of `env`, which `settle` is a reference of.
unsafe fn call_settle(
    env: sys::napi_env,
    context: sys::napi_async_context,
    settle: sys::napi_ref,
    results: &raw::Numbers,
    done: &VecDeque<Completion>,
    events: &[Event],
) {
    let mut scope = ptr::null_mut();
    // SAFETY: as the caller promises; every handle below is of this scope.
    unsafe {
        if sys::napi_open_handle_scope(env, &mut scope) != sys::Status::napi_ok {
            return;
        }
        let mut func = ptr::null_mut();
        let mut this = ptr::null_mut();
        let args = raw::check(env, sys::napi_get_reference_value(env, settle, &mut func))
            .and_then(|()| raw::check(env, sys::napi_get_global(env, &mut this)))
            .and_then(|()| settle_args(env, done, done.len(), results, events));
        if let (Ok(argv), false) = (args, func.is_null()) {
            let mut ignored = ptr::null_mut();
            let status = sys::napi_make_callback(
                env,
                context,
                this,
                func,
                argv.len(),
                argv.as_ptr(),
                &mut ignored,
            );
            if status == sys::Status::napi_pending_exception {
                let mut error = ptr::null_mut();
                if sys::napi_get_and_clear_last_exception(env, &mut error) == sys::Status::napi_ok {
                    sys::napi_fatal_exception(env, error);
                }
            }
        }
        sys::napi_close_handle_scope(env, scope);
    }
}
