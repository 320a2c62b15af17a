//! redisStore on one server, run on Node's own event loop: a hit is
//! encoded and written from the JS thread, the socket is watched by a libuv
//! poll handle, and a reply settles its hit's promise in the callback that
//! read it. No thread is crossed per hit, and an idle store has nothing to
//! wake: only a connect runs on a thread of its own (blocking DNS, TCP,
//! TLS handshake, AUTH and SELECT), which wakes the loop when it is done.
//!
//! Stores of one JS thread with the same server and credentials share one
//! connection (`Conn`): a store made per request by mistake then costs no
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
use crate::errors::Error;
use crate::ops::{Args, Op};
use crate::redis::health::{Backoff, Gate};
use crate::redis::pipe::{Done, Pipe, Request};
use crate::redis::socket::{Socket, Target};
use crate::redis::stats::{self, Event};
use crate::redis::{Completion, Config};
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

enum Link {
    Down,
    Connecting,
    Up {
        socket: Box<Socket>,
        poll: *mut Handle,
        /// What the poll handle watches for: None before it is started,
        /// then whether it watches for room to write too.
        writing: Option<bool>,
    },
}

/// One store's side of a shared connection: where its results go.
struct Sink {
    settle: sys::napi_ref,
    results: Arc<raw::Numbers>,
    done: Vec<Completion>,
    /// Connection events not yet handed to this store's `settle`.
    events: Vec<Event>,
    /// Hits of this store whose promise has not settled.
    in_flight: usize,
    closed: bool,
}

/// One connection to one server, shared by the stores of a JS thread that
/// name the same server and credentials.
pub struct Conn {
    env: sys::napi_env,
    uv: &'static Uv,
    lp: *mut uv::Loop,
    target: Arc<Target>,
    /// What stores must match to share this connection.
    key: Config,
    connect_timeout: Duration,
    async_context: sys::napi_async_context,
    link: Link,
    pipe: Pipe,
    /// Hits waiting for the connection.
    waiting: VecDeque<Request>,
    connecting: Arc<Mutex<Connecting>>,
    timer: *mut Handle,
    wakeup: *mut Handle,
    /// Spaces out connects after failures.
    backoff: Backoff,
    /// The connection has answered something since it was opened.
    answered: bool,
    /// A connection has been open (so the next is a reconnect).
    was_up: bool,
    /// Results not yet routed to their store.
    done: Vec<Done>,
    /// Indexed by the high half of a request's id.
    sinks: Vec<Option<Sink>>,
    torn_down: bool,
    /// The address of the RefCell this connection lives in: every handle's data.
    cell: *mut c_void,
}

type SharedConn = Rc<RefCell<Conn>>;

thread_local! {
    /// This thread's connections, by what they connect to.
    static CONNS: RefCell<Vec<Weak<RefCell<Conn>>>> = const { RefCell::new(Vec::new()) };
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
                .find(|c| c.borrow().key == key && !c.borrow().torn_down)
        });
        let conn = match found {
            Some(conn) => conn,
            None => {
                // SAFETY: as the caller promises.
                let conn = unsafe { Conn::open(env, config, key)? };
                CONNS.with(|conns| conns.borrow_mut().push(Rc::downgrade(&conn)));
                conn
            }
        };
        let sink = {
            let mut c = conn.borrow_mut();
            let sink = Sink {
                settle,
                results,
                done: Vec::new(),
                events: Vec::new(),
                in_flight: 0,
                closed: false,
            };
            match c.sinks.iter().position(Option::is_none) {
                Some(free) => {
                    c.sinks[free] = Some(sink);
                    free
                }
                None => {
                    c.sinks.push(Some(sink));
                    c.sinks.len() - 1
                }
            }
        };
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
        };
        self.conn.borrow_mut().send(self.sink, request)
    }

    pub fn flush(&self) {
        self.conn.borrow_mut().flush();
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
        let mut conn = self.conn.borrow_mut();
        if let Some(sink) = conn.sinks[self.sink].as_mut() {
            sink.closed = true;
        }
        conn.release_idle();
    }
}

impl Drop for LoopStore {
    fn drop(&mut self) {
        // Nobody waits for this store's results any more: the connection
        // (if no other store uses it) ends with the store.
        let mut conn = self.conn.borrow_mut();
        conn.sinks[self.sink] = None;
        conn.release_idle();
    }
}

impl Conn {
    /// # Safety
    /// On the JS thread inside a callback of `env`.
    unsafe fn open(env: sys::napi_env, config: &Config, key: Config) -> Result<SharedConn, Error> {
        let uv = uv::uv()?;
        let target = Arc::new(Target::new(config)?);
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
        let conn = Rc::new(RefCell::new(Conn {
            env,
            uv,
            lp,
            target,
            key,
            connect_timeout: Duration::from_millis(config.timeout_ms),
            async_context,
            link: Link::Down,
            pipe: Pipe::new(config.secrets()),
            waiting: VecDeque::new(),
            connecting: Arc::new(Mutex::new(Connecting {
                result: None,
                wake: None,
            })),
            timer: ptr::null_mut(),
            wakeup: ptr::null_mut(),
            backoff: Backoff::new(rand::random()),
            answered: false,
            was_up: false,
            done: Vec::new(),
            sinks: Vec::new(),
            torn_down: false,
            cell: ptr::null_mut(),
        }));
        let data = Rc::as_ptr(&conn).cast_mut().cast::<c_void>();
        conn.borrow_mut().cell = data;
        // SAFETY: on the loop's thread; each handle's data is the connection,
        // which outlives them: `teardown` closes them before it is dropped.
        unsafe {
            let timer = uv.timer(lp, data)?;
            let wakeup = uv
                .wakeup(lp, data, on_connected)
                .inspect_err(|_| uv.close(timer.0))?;
            let mut c = conn.borrow_mut();
            c.timer = timer.0;
            c.wakeup = wakeup.0;
            c.connecting.lock().unwrap_or_else(|e| e.into_inner()).wake =
                Some(WakeHandle(wakeup.0));
        }
        Ok(conn)
    }

    fn send(&mut self, sink: usize, request: Request) -> Result<(), Error> {
        match self.sinks[sink].as_ref() {
            Some(s) if !s.closed && !self.torn_down => {}
            _ => return Err(Error::Closed),
        }
        let idle = self.in_flight() == 0;
        match self.link {
            Link::Up { .. } => self.pipe.send(request),
            Link::Connecting => self.waiting.push_back(request),
            Link::Down => match self.backoff.gate(request.sent_at) {
                // Refused at once, unsent, while connects back off.
                Gate::Refuse(error) => return Err(error),
                Gate::Open | Gate::Probe => {
                    self.waiting.push_back(request);
                    self.connect();
                }
            },
        }
        if let Some(s) = self.sinks[sink].as_mut() {
            s.in_flight += 1;
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
            self.connect_timeout,
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
        let data = self.cell;
        match result.and_then(|socket| {
            // SAFETY: on the loop's thread; the socket stays open as long
            // as the handle (both go together in `drop_link`).
            let poll = unsafe { self.uv.poll(self.lp, socket.raw() as uv::Socket, data)? };
            Ok((socket, poll.0))
        }) {
            Ok((socket, poll)) => {
                let tally = &mut self.pipe.tally;
                tally.connects += 1;
                let event = match std::mem::replace(&mut self.was_up, true) {
                    false => Event::Connected,
                    true => {
                        tally.reconnects += 1;
                        Event::Reconnected
                    }
                };
                self.tell(event);
                // The backoff ends with the first answer, not the connect: an
                // endpoint that accepts and closes must not be hammered.
                self.answered = false;
                self.link = Link::Up {
                    socket: Box::new(socket),
                    poll,
                    writing: None,
                };
                while let Some(request) = self.waiting.pop_front() {
                    self.pipe.send(request);
                }
                self.watch(false);
                self.flush();
            }
            Err(error) => {
                self.link = Link::Down;
                self.pipe.tally.connect_failures += 1;
                self.backoff.failed(Instant::now(), error.clone());
                // Never sent, so never counted.
                for request in self.waiting.drain(..) {
                    self.done.push(Done {
                        id: request.id,
                        result: Err(error.clone()),
                    });
                }
            }
        }
    }

    /// Writes what is queued, as far as the socket takes it now.
    fn flush(&mut self) {
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
    /// libuv restarts a poll handle with a system call or two, so only a
    /// change is passed on.
    fn watch(&mut self, writing: bool) {
        let Link::Up {
            poll, writing: was, ..
        } = &mut self.link
        else {
            return;
        };
        if *was == Some(writing) {
            return;
        }
        *was = Some(writing);
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
                    if health.unusable {
                        // A demoted primary (or one still loading): a new
                        // connection finds the server the name points to now,
                        // after a backoff, as for a failed connect.
                        let why = "the server can no longer take writes (READONLY, MASTERDOWN or LOADING)";
                        self.end(why);
                        self.backoff.failed(
                            Instant::now(),
                            Error::Redis(format!("{why}: it was demoted or is loading")),
                        );
                        return;
                    }
                    if health.answered && !self.answered {
                        self.answered = true;
                        self.backoff.succeeded();
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

    /// The connection failed: every hit on it rejects; the next hit connects
    /// anew. One that ends before it answered anything counts as a failed
    /// connect for the backoff.
    fn lost(&mut self, why: &str) {
        if !self.answered {
            return self.failed(why);
        }
        self.end(why);
    }

    /// The connection is unusable: ends it, and backs off before the next.
    fn failed(&mut self, why: &str) {
        let error = self.end(why);
        self.backoff.failed(Instant::now(), error);
    }

    fn end(&mut self, why: &str) -> Error {
        let error = Error::Connection {
            text: format!(
                "the connection to Redis failed ({why}); the hit was not sent again and may or may not have counted"
            ),
            sent: true,
        };
        self.pipe.fail(&error, &mut self.done);
        self.drop_link();
        self.pipe.tally.losses += 1;
        self.tell(Event::Lost(error.code()));
        error
    }

    /// Queues a connection event for every store on the connection.
    fn tell(&mut self, event: Event) {
        for sink in self.sinks.iter_mut().flatten() {
            sink.events.push(event);
        }
    }

    fn drop_link(&mut self) {
        if let Link::Up { poll, .. } = std::mem::replace(&mut self.link, Link::Down) {
            // SAFETY: on the loop's thread; the handle is not used after.
            // libuv allows closing the socket (dropped with the old link)
            // right after uv_close.
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
        // Hits wait in the order they were sent, but each store has its own timeout.
        while let Some(i) = self.waiting.iter().position(|r| r.deadline <= now) {
            if let Some(request) = self.waiting.remove(i) {
                self.pipe.tally.timeouts += 1;
                self.done.push(Done {
                    id: request.id,
                    result: Err(Error::Timeout {
                        ms: request
                            .deadline
                            .saturating_duration_since(request.sent_at)
                            .as_millis() as u64,
                        sent: false,
                    }),
                });
            }
        }
        // A stuck connection (a paused server, a half-open socket, or one
        // whose hits time out in a row) is replaced.
        if self.pipe.expire(now, &mut self.done) {
            self.lost("no answer within timeoutMs");
        }
    }

    /// Routes results to their stores' sinks.
    fn route(&mut self) {
        for done in self.done.drain(..) {
            let (sink, id) = ((done.id >> 32) as usize, done.id as u32);
            if let Some(Some(sink)) = self.sinks.get_mut(sink) {
                sink.in_flight = sink.in_flight.saturating_sub(1);
                sink.done.push(Completion {
                    id,
                    result: done.result,
                });
            }
        }
    }

    /// Frees the sinks of closed stores with nothing in flight, and ends
    /// the connection once no store uses it.
    fn release_idle(&mut self) {
        for slot in self.sinks.iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|s| s.closed && s.in_flight == 0 && s.done.is_empty())
            {
                *slot = None;
            }
        }
        if self.sinks.iter().all(Option::is_none) {
            self.teardown();
        }
    }

    /// Closes every handle. The connection's memory goes with its last store.
    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut done = Vec::new();
        self.pipe.fail(&Error::Closed, &mut done);
        self.waiting.clear();
        self.drop_link();
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

impl Drop for Conn {
    fn drop(&mut self) {
        self.teardown();
        // SAFETY: the async context was made on this env's thread, where the
        // last store of the connection lets it go.
        unsafe { sys::napi_async_destroy(self.env, self.async_context) };
    }
}

/// Runs `f` on the connection behind a handle, then hands what finished to
/// JavaScript, with no borrow held while JavaScript runs (it may send hits
/// or close stores).
///
/// # Safety
/// `handle` is a live handle made by `Conn::open` or `Conn::connected`.
unsafe fn with_conn(handle: *mut Handle, f: impl FnOnce(&mut Conn)) {
    let Ok(uv) = uv::uv() else { return };
    // SAFETY: the data is the RefCell's address inside the connection's Rc,
    // which outlives its handles (`teardown` closes them first, and runs
    // before the Rc's memory goes); libuv calls back on the JS thread.
    let cell = unsafe { &*uv.data(handle).cast::<RefCell<Conn>>() };
    {
        let Ok(mut conn) = cell.try_borrow_mut() else {
            return; // Reentered: the outer call delivers.
        };
        // No panic may cross into libuv.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut conn))).is_err() {
            conn.lost("a Rust panic was caught");
        }
    }
    deliver(cell);
}

unsafe extern "C" fn on_ready(handle: *mut Handle, status: i32, events: i32) {
    // SAFETY: libuv passes the poll handle made in `connected`.
    unsafe { with_conn(handle, |c| c.ready(status, events)) }
}

unsafe extern "C" fn on_timer(handle: *mut Handle) {
    // SAFETY: libuv passes the timer made in `open`.
    unsafe { with_conn(handle, Conn::expired) }
}

unsafe extern "C" fn on_connected(handle: *mut Handle) {
    // SAFETY: libuv passes the async handle made in `open`.
    unsafe {
        with_conn(handle, |c| {
            let result = c
                .connecting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .result
                .take();
            if let Some(result) = result {
                c.connected(result);
            }
        })
    }
}

/// Hands every finished hit to its store's `settle`, then re-arms the timer
/// and lets closed stores go once their hits have settled.
fn deliver(cell: &RefCell<Conn>) {
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
            let (settle, results) = (sink.settle, Arc::clone(&sink.results));
            (c.env, c.async_context, settle, results, done, events)
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
