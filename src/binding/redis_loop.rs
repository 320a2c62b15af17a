//! redisStore on one server, run on Node's own event loop: a hit is
//! encoded and written from the JS thread, the socket is watched by a libuv
//! poll handle, and a reply settles its hit's promise in the callback that
//! read it. No thread is crossed per hit, and an idle store has nothing to
//! wake: only a connect runs on a thread of its own (blocking DNS, TCP,
//! TLS handshake, AUTH and SELECT), which wakes the loop when it is done.
//!
//! Everything here runs on the JS thread of one environment but the
//! connect thread, which touches only its `Connecting` slot.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use napi::sys;

use super::raw;
use super::redis::settle_args;
use super::uv::{self, Handle, Uv};
use crate::errors::Error;
use crate::redis::pipe::{Pipe, Request};
use crate::redis::socket::{Socket, Target};
use crate::redis::{Completion, Config};
use crate::wtf8;

/// Hits one call of `settle` hands over at most.
const BATCH: usize = 1024;
/// The first pause after a failed connect; each failure in a row doubles
/// it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where a connect thread leaves its socket, and how it wakes the loop.
struct Connecting {
    result: Option<Result<Socket, Error>>,
    /// The async handle to wake; None once the store is torn down.
    wake: Option<WakeHandle>,
}

struct WakeHandle(*mut Handle);
// SAFETY: the handle is only passed to `uv_async_send`, which libuv allows
// from any thread, and only while the slot's lock shows it is still open.
unsafe impl Send for WakeHandle {}

enum Link {
    Down,
    Connecting,
    Up {
        socket: Box<Socket>,
        poll: *mut Handle,
        writing: bool,
    },
    /// Connects failed: hits reject at once until `until`, then one connects.
    Backoff {
        until: Instant,
        error: Error,
    },
}

pub struct LoopStore {
    env: sys::napi_env,
    uv: &'static Uv,
    lp: *mut uv::Loop,
    target: Arc<Target>,
    prefix: Vec<u8>,
    timeout: Duration,
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
    async_context: sys::napi_async_context,
    link: Link,
    pipe: Pipe,
    /// Hits waiting for the connection.
    waiting: VecDeque<Request>,
    connecting: Arc<Mutex<Connecting>>,
    timer: *mut Handle,
    wakeup: *mut Handle,
    /// Failed connects in a row.
    failures: u32,
    /// When the connection last answered anything.
    last_answer: Instant,
    done: Vec<Completion>,
    closed: bool,
    torn_down: bool,
    /// The address of the RefCell this store lives in: every handle's data.
    cell: *mut c_void,
}

/// The store as the JS thread shares it between its functions and handles.
pub type Shared = Rc<RefCell<LoopStore>>;

impl LoopStore {
    /// A store for `config`, on the loop of `env`.
    ///
    /// # Safety
    /// On the JS thread inside a callback of `env`; `settle` is a reference
    /// of `env` that outlives the store (it is deleted by the caller after
    /// `teardown`).
    pub unsafe fn open(
        env: sys::napi_env,
        config: &Config,
        prefix: Vec<u8>,
        settle: sys::napi_ref,
        results: Arc<raw::Numbers>,
    ) -> Result<Shared, Error> {
        let uv = uv::uv()?;
        let target = Arc::new(Target::new(config)?);
        let mut lp = ptr::null_mut();
        // SAFETY: as the caller promises.
        raw::check(env, unsafe { sys::napi_get_uv_event_loop(env, &mut lp) })?;
        let mut async_context = ptr::null_mut();
        // SAFETY: as the caller promises; the name is a string of this scope.
        unsafe {
            let mut name = ptr::null_mut();
            let label = "ratestore.redisStore";
            raw::check(
                env,
                sys::napi_create_string_utf8(
                    env,
                    label.as_ptr().cast(),
                    label.len() as isize,
                    &mut name,
                ),
            )?;
            raw::check(
                env,
                sys::napi_async_init(env, ptr::null_mut(), name, &mut async_context),
            )?;
        }
        let secrets = config.secrets();
        let store = Rc::new(RefCell::new(LoopStore {
            env,
            uv,
            lp,
            target,
            prefix,
            timeout: Duration::from_millis(config.timeout_ms),
            settle,
            results,
            async_context,
            link: Link::Down,
            pipe: Pipe::new(crate::redis::store::sha(), config.timeout_ms, secrets),
            waiting: VecDeque::new(),
            connecting: Arc::new(Mutex::new(Connecting {
                result: None,
                wake: None,
            })),
            timer: ptr::null_mut(),
            wakeup: ptr::null_mut(),
            failures: 0,
            last_answer: Instant::now(),
            done: Vec::new(),
            closed: false,
            torn_down: false,
            cell: ptr::null_mut(),
        }));
        let data = Rc::as_ptr(&store).cast_mut().cast::<c_void>();
        store.borrow_mut().cell = data;
        // SAFETY: on the loop's thread; each handle's data is the store,
        // which outlives them: `teardown` closes them before the last
        // holder lets the store go (see `Holder`).
        unsafe {
            let timer = uv.timer(lp, data)?;
            let wakeup = uv
                .wakeup(lp, data, on_connected)
                .inspect_err(|_| uv.close(timer.0))?;
            let mut s = store.borrow_mut();
            s.timer = timer.0;
            s.wakeup = wakeup.0;
            s.connecting.lock().unwrap_or_else(|e| e.into_inner()).wake =
                Some(WakeHandle(wakeup.0));
        }
        Ok(store)
    }

    /// Queues a hit (`key` in UTF-16 code units, sent as WTF-8).
    pub fn send(&mut self, id: u32, key: &[u16], window_ms: u64, amount: i64) -> Result<(), Error> {
        if self.closed {
            return Err(Error::Closed);
        }
        let now = Instant::now();
        if let Link::Backoff { until, error } = &self.link {
            if now < *until {
                return Err(error.clone());
            }
            self.link = Link::Down;
        }
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(&self.prefix);
        wtf8::extend(&mut full, key);
        let request = Request {
            id,
            key: full.into_boxed_slice(),
            window_ms,
            amount,
            deadline: now + self.timeout,
        };
        let idle = self.in_flight() == 0;
        match self.link {
            Link::Up { .. } => self.pipe.send(request),
            Link::Connecting => self.waiting.push_back(request),
            Link::Down | Link::Backoff { .. } => {
                self.waiting.push_back(request);
                self.connect();
            }
        }
        if idle {
            self.arm();
        }
        Ok(())
    }

    /// Hits whose promise has not settled yet.
    fn in_flight(&self) -> usize {
        self.pipe.unsettled() + self.waiting.len()
    }

    /// Starts a connect on a thread of its own.
    fn connect(&mut self) {
        self.link = Link::Connecting;
        let (target, slot, timeout) = (
            Arc::clone(&self.target),
            Arc::clone(&self.connecting),
            self.timeout,
        );
        let started = std::thread::Builder::new()
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
            });
        if started.is_err() {
            self.connected(Err(Error::Internal("could not start a connect thread")));
        }
    }

    /// A connect finished.
    fn connected(&mut self, result: Result<Socket, Error>) {
        if self.torn_down {
            return;
        }
        match result.and_then(|socket| {
            let data = self.cell;
            // SAFETY: on the loop's thread; the socket stays open as long
            // as the handle (both are dropped together in `drop_link`).
            let poll = unsafe { self.uv.poll(self.lp, socket.raw() as uv::Socket, data)? };
            Ok((socket, poll.0))
        }) {
            Ok((socket, poll)) => {
                self.failures = 0;
                self.last_answer = Instant::now();
                self.link = Link::Up {
                    socket: Box::new(socket),
                    poll,
                    writing: false,
                };
                while let Some(request) = self.waiting.pop_front() {
                    self.pipe.send(request);
                }
                self.watch(false);
                self.flush();
            }
            Err(error) => {
                self.failures = self.failures.saturating_add(1);
                let pause = backoff(self.failures);
                self.link = Link::Backoff {
                    until: Instant::now() + pause,
                    error: error.clone(),
                };
                // Never sent, so never counted.
                for request in self.waiting.drain(..) {
                    self.done.push(Completion {
                        id: request.id,
                        result: Err(error.clone()),
                    });
                }
            }
        }
    }

    /// Writes what is queued, as far as the socket takes it now.
    pub fn flush(&mut self) {
        let Link::Up { socket, .. } = &mut self.link else {
            return;
        };
        if self.pipe.out.is_empty() {
            return;
        }
        match socket.write(&mut self.pipe.out) {
            Ok(all) => self.watch(!all),
            Err(e) => self.lost(&e.to_string()),
        }
    }

    /// Watches the socket for answers, and for room to write if `writing`.
    fn watch(&mut self, writing: bool) {
        let Link::Up {
            poll, writing: was, ..
        } = &mut self.link
        else {
            return;
        };
        if *was == writing && writing {
            return;
        }
        *was = writing;
        let events = uv::READABLE | if writing { uv::WRITABLE } else { 0 };
        // SAFETY: on the loop's thread; `poll` is this link's live handle.
        if unsafe { self.uv.poll_start(*poll, events, on_ready) } != 0 {
            self.lost("the event loop could not watch the socket");
        }
    }

    /// The socket is ready.
    fn ready(&mut self, status: i32, events: i32) {
        if status < 0 {
            return self.lost(&format!("libuv error {status}"));
        }
        if events & uv::WRITABLE != 0 {
            self.flush();
        }
        if events & uv::READABLE != 0 {
            let Link::Up { socket, .. } = &mut self.link else {
                return;
            };
            let open = socket.read(self.pipe.parser());
            match self.pipe.answers(&mut self.done) {
                Err(_) => return self.lost("Redis answered out of protocol"),
                Ok(health) => {
                    if health.answered {
                        self.last_answer = Instant::now();
                    }
                    if health.unusable {
                        // A demoted primary (or one still loading): a new
                        // connection finds the server the name points to now.
                        return self.lost("the server can no longer take writes (READONLY, MASTERDOWN or LOADING)");
                    }
                }
            }
            match open {
                Ok(true) => {}
                Ok(false) => return self.lost("the server closed the connection"),
                Err(e) => return self.lost(&e.to_string()),
            }
            // NOSCRIPT retries go out at once.
            self.flush();
        }
    }

    /// The connection failed: every hit on it rejects; the next hit connects anew.
    fn lost(&mut self, why: &str) {
        let error = Error::Connection(format!(
            "the connection to Redis failed ({why}); the hit was not sent again and may or may not have counted"
        ));
        self.pipe.fail(&error, &mut self.done);
        self.drop_link();
    }

    fn drop_link(&mut self) {
        if let Link::Up { poll, .. } = std::mem::replace(&mut self.link, Link::Down) {
            // SAFETY: on the loop's thread; the handle is not used after.
            // The socket (dropped with the old link) closes after libuv
            // stops watching it: uv_close stops the poll at once.
            unsafe { self.uv.close(poll) };
        }
    }

    /// Arms the timer for the earliest deadline, or stops it when idle (an
    /// armed timer is what keeps the process alive while hits are in flight).
    fn arm(&mut self) {
        if self.timer.is_null() {
            return;
        }
        let next = [
            self.pipe.next_deadline(),
            self.waiting.front().map(|r| r.deadline),
        ]
        .into_iter()
        .flatten()
        .min();
        // SAFETY: on the loop's thread; the timer is live until teardown.
        unsafe {
            match next {
                Some(at) => {
                    let ms = at.saturating_duration_since(Instant::now()).as_millis() as u64 + 1;
                    self.uv.timer_start(self.timer, on_timer, ms);
                }
                // Idle, or only hits already settled by a timeout remain
                // (a stuck connection must not keep the process alive).
                None => self.uv.timer_stop(self.timer),
            }
        }
    }

    /// Deadlines passed: those hits reject.
    fn expired(&mut self) {
        let now = Instant::now();
        while self.waiting.front().is_some_and(|r| r.deadline <= now) {
            let request = self.waiting.pop_front().expect("checked above");
            self.done.push(Completion {
                id: request.id,
                result: Err(Error::Timeout(self.timeout.as_millis() as u64)),
            });
        }
        let timed_out = self.pipe.expire(now, &mut self.done);
        if timed_out > 0 {
            // The oldest hit that timed out was sent a timeout ago: a
            // connection that has answered nothing since is stuck (a paused
            // server, a half-open socket), and is replaced at once.
            let sent = now - self.timeout;
            if self.last_answer < sent {
                self.lost("no answer within timeoutMs");
            }
        }
    }

    /// Refuses later hits; the connection ends once the hits in flight settle.
    pub fn close(&mut self) {
        self.closed = true;
        if self.in_flight() == 0 {
            self.teardown();
        }
    }

    /// Closes every handle (the store's memory goes once its last holder does).
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        self.closed = true;
        self.drop_link();
        self.connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake = None;
        // SAFETY: on the loop's thread; the handles are live and not used after.
        unsafe {
            for handle in [
                std::mem::replace(&mut self.timer, ptr::null_mut()),
                std::mem::replace(&mut self.wakeup, ptr::null_mut()),
            ] {
                if !handle.is_null() {
                    self.uv.close(handle);
                }
            }
        }
    }
}

/// The pause after `failures` failed connects in a row: doubling from
/// [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], less up to a quarter at random
/// so that many processes don't retry in step.
fn backoff(failures: u32) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    full.mul_f64(1.0 - rand::random::<f64>() / 4.0)
}

/// The store behind a handle's data pointer.
///
/// # Safety
/// `handle` is a live handle made by `LoopStore::open` or `connected`.
unsafe fn store_of<'a>(uv: &Uv, handle: *mut Handle) -> &'a RefCell<LoopStore> {
    // SAFETY: the data is the RefCell's address inside the store's Rc, which
    // outlives its handles (see `Holder`); libuv calls back on the JS thread.
    unsafe { &*uv.data(handle).cast::<RefCell<LoopStore>>() }
}

/// Runs `f` on the store, then hands what finished to JavaScript, with no
/// borrow held while JavaScript runs (it may send hits or close).
///
/// # Safety
/// As `store_of`.
unsafe fn with_store(handle: *mut Handle, f: impl FnOnce(&mut LoopStore)) {
    let Ok(uv) = uv::uv() else { return };
    // SAFETY: as the caller promises.
    let cell = unsafe { store_of(uv, handle) };
    let Ok(mut store) = cell.try_borrow_mut() else {
        return; // Reentered: the outer call delivers.
    };
    // No panic may cross into libuv.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut store))).is_err() {
        store
            .pipe
            .fail(&Error::Internal("a Rust panic was caught"), &mut Vec::new());
    }
    drop(store);
    deliver(cell);
}

unsafe extern "C" fn on_ready(handle: *mut Handle, status: i32, events: i32) {
    // SAFETY: libuv passes the poll handle made in `connected`.
    unsafe { with_store(handle, |s| s.ready(status, events)) }
}

unsafe extern "C" fn on_timer(handle: *mut Handle) {
    // SAFETY: libuv passes the timer made in `open`.
    unsafe { with_store(handle, LoopStore::expired) }
}

unsafe extern "C" fn on_connected(handle: *mut Handle) {
    // SAFETY: libuv passes the async handle made in `open`.
    unsafe {
        with_store(handle, |s| {
            let result = s
                .connecting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .result
                .take();
            if let Some(result) = result {
                s.connected(result);
            }
        })
    }
}

/// Hands every finished hit to `settle`, then re-arms the timer and ends a
/// closed store once nothing is in flight.
pub fn deliver(cell: &RefCell<LoopStore>) {
    loop {
        let (env, settle, context, results, mut done) = {
            let Ok(mut s) = cell.try_borrow_mut() else {
                return;
            };
            if s.done.is_empty() {
                s.arm();
                if s.closed && s.in_flight() == 0 {
                    s.teardown();
                }
                return;
            }
            let count = s.done.len().min(BATCH);
            let done: Vec<Completion> = s.done.drain(..count).collect();
            (
                s.env,
                s.settle,
                s.async_context,
                Arc::clone(&s.results),
                done,
            )
        };
        // SAFETY: on the JS thread, outside any other Node-API call (a
        // libuv callback, or the tail of a store function's call).
        unsafe { call_settle(env, settle, context, &results, &mut done) };
    }
}

/// Calls `settle(n, errors)` for `done` in a scope of its own, as libuv
/// callbacks must (microtasks run when it ends); an exception it throws is
/// reported as uncaught.
///
/// # Safety
/// On the JS thread of `env`.
unsafe fn call_settle(
    env: sys::napi_env,
    settle: sys::napi_ref,
    context: sys::napi_async_context,
    results: &raw::Numbers,
    done: &mut Vec<Completion>,
) {
    let mut scope = ptr::null_mut();
    // SAFETY: as the caller promises; every handle below is of this scope.
    unsafe {
        if sys::napi_open_handle_scope(env, &mut scope) != sys::Status::napi_ok {
            return;
        }
        let mut func = ptr::null_mut();
        let mut this = ptr::null_mut();
        let pending: VecDeque<Completion> = done.drain(..).collect();
        let called = raw::check(env, sys::napi_get_reference_value(env, settle, &mut func))
            .and_then(|()| raw::check(env, sys::napi_get_global(env, &mut this)))
            .and_then(|()| settle_args(env, &pending, pending.len(), results));
        if let (Ok(argv), false) = (called, func.is_null()) {
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

impl Drop for LoopStore {
    fn drop(&mut self) {
        self.teardown();
        // SAFETY: the async context was made on this env's thread, where
        // the last holder of the store lets it go.
        unsafe { sys::napi_async_destroy(self.env, self.async_context) };
    }
}
