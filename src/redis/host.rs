//! The I/O thread's host of the connection engine ([`conn`](super::conn) +
//! [`pipe`](super::pipe)), as the binding's libuv glue is the event loop's:
//! one tokio task per connection owns it, and moves its bytes (the socket's
//! readiness, through tokio's reactor), its time (one `sleep_until` for its
//! earliest deadline) and its calls (a channel of pipelines from the
//! stores). Nothing of the connection's rules is here.
//!
//! A [`Node`] is one server's connection as the stores see it: each
//! pipeline handed to it is answered in order, one result per call, once
//! every call of it has settled. The task ends when the last handle goes;
//! while nothing is in flight it waits on its channel and the socket only
//! (no timer, no wake-up), so an idle store costs no CPU.

use std::future::{pending, poll_fn, Future};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::{Interest, Ready};
use tokio::sync::{mpsc, oneshot};

use super::calls::Query;
use super::config::{Addr, Config, Deployment};
use super::conn::{Conn, Io};
use super::pipe::{Request, Route};
use super::reply::Answers;
use super::resp::{Parser, Value};
use super::routing::NodeRef;
use super::socket::{held, Socket, Target};
use super::stats::{Event, Monitor};
use crate::delivery::Completion;
use crate::errors::{Error, Result};
use crate::ops::{Answer, Op};
use crate::runtime;

/// One server's engine, run by a task of the I/O thread.
pub struct Node {
    calls: mpsc::UnboundedSender<Pipeline>,
    timeout: Duration,
    monitor: Arc<Monitor>,
    /// The host name it connects to (empty for a Unix socket or Sentinel).
    host: String,
}

/// Calls handed over together, and where their results go.
struct Pipeline {
    requests: Vec<Request>,
    reply: oneshot::Sender<Settled>,
}

/// A pipeline's results: one per call, in order, and the reply of a
/// [`Route::Slots`] request.
#[derive(Default)]
struct Settled {
    results: Vec<Result<Answers>>,
    slots: Option<Value>,
}

/// A pipeline's results as they come in (a sink of the engine's).
struct Gathered {
    results: Vec<Option<Result<Answers>>>,
    slots: Option<Value>,
    left: usize,
    reply: Option<oneshot::Sender<Settled>>,
}

type Engine = Conn<TokioIo, Option<Gathered>>;

/// The sink every connection event goes to (joined first, left last): its
/// events are told to the stores through the monitor.
const EVENTS: usize = 0;

/// Two handles of one node are one connection.
impl NodeRef for Arc<Node> {
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(self, other)
    }
}

impl Node {
    /// Starts the task of a connection to `config`'s server (or master,
    /// through Sentinel), on the I/O thread. Its counts and events go to
    /// `monitor` (shared by a cluster's nodes).
    pub fn start(config: &Config, monitor: Arc<Monitor>) -> Result<Node> {
        let mut conn = Conn::new(config, config.clone(), TokioIo::default(), rand::random())?;
        let events = conn.join(None);
        debug_assert_eq!(events, EVENTS);
        let (calls, queue) = mpsc::unbounded_channel();
        runtime::handle()?.spawn(run(conn, queue, Arc::clone(&monitor)));
        let host = match &config.deployment {
            Deployment::Server(Addr::Tcp { host, .. }) => host.clone(),
            _ => String::new(),
        };
        Ok(Node {
            calls,
            timeout: Duration::from_millis(config.timeout_ms),
            monitor,
            host,
        })
    }

    /// What this connection counts and tells.
    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    /// The host name it connects to (empty for a Unix socket or Sentinel).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The store's timeout, from now: a call's deadline.
    pub fn deadline(&self, now: Instant) -> Instant {
        now + self.timeout
    }

    /// Sends the calls as one pipeline (each after `ASKING` if `asking`),
    /// handed over at `sent_at`, each to settle by `deadline` (connecting
    /// included); answers their results in order.
    pub async fn hits(
        &self,
        queries: &[Query<'_>],
        asking: bool,
        (sent_at, deadline): (Instant, Instant),
    ) -> Vec<Result<Answers>> {
        let route = match asking {
            true => Route::Asking,
            false => Route::Direct,
        };
        let requests = queries
            .iter()
            .map(|q| Request {
                id: 0,
                op: q.op,
                args: q.args,
                key: q.key.into(),
                sent_at,
                deadline,
                route,
            })
            .collect();
        match self.pipeline(requests).await {
            Some(settled) => settled.results,
            None => {
                let gone = || Err(Error::Internal("the connection's task ended"));
                queries.iter().map(|_| gone()).collect()
            }
        }
    }

    /// Asks the node for its cluster's slot map (`CLUSTER SLOTS`) by
    /// `deadline`: its reply, an error reply included.
    pub async fn slots(&self, deadline: Instant) -> Result<Value> {
        let now = Instant::now();
        let request = Request {
            id: 0,
            op: Op::Ping,
            args: [0; 4],
            key: Box::default(),
            sent_at: now,
            deadline: deadline.max(now),
            route: Route::Slots,
        };
        let Some(mut settled) = self.pipeline(vec![request]).await else {
            return Err(Error::Internal("the connection's task ended"));
        };
        match (settled.slots, settled.results.pop()) {
            (Some(reply), _) => Ok(reply),
            (None, Some(Err(e))) => Err(e),
            (None, _) => Err(Error::Internal("CLUSTER SLOTS got no answer")),
        }
    }

    async fn pipeline(&self, requests: Vec<Request>) -> Option<Settled> {
        let (reply, answered) = oneshot::channel();
        self.calls.send(Pipeline { requests, reply }).ok()?;
        answered.await.ok()
    }
}

/// The engine's host: what it asked for, which the task waits on.
#[derive(Default)]
struct TokioIo {
    /// A connect under way on a thread of its own.
    connecting: Option<oneshot::Receiver<Result<Socket>>>,
    /// The socket's readiness, while a connection is up.
    watched: Option<Watched>,
    /// The socket, while a connection is up (dropped after `watched`).
    socket: Option<Box<Socket>>,
    /// Whether room to write is awaited too.
    writing: bool,
    /// When the engine wants [`Conn::handle_timeout`] ([`Conn::poll_timeout`]).
    deadline: Option<Instant>,
}

impl Io for TokioIo {
    type Socket = Socket;

    /// Connects on a short-lived thread (DNS, TCP, TLS, AUTH and SELECT
    /// block; a Sentinel discovery too), which leaves its socket for the task.
    fn connect(&mut self, target: Arc<Target>, timeout: Duration) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("ratestore-redis-connect".into())
            .spawn(move || {
                let _ = tx.send(target.connect(timeout));
            })
            .map_err(|_| Error::Internal("could not start a connect thread"))?;
        self.connecting = Some(rx);
        Ok(())
    }

    fn open(&mut self, socket: Socket) -> Result<()> {
        self.watched = Some(Watched::new(&socket).map_err(|e| Error::Connection {
            text: format!("the I/O thread could not watch the socket ({e}); the call was not sent"),
            sent: false,
        })?);
        self.socket = Some(Box::new(socket));
        self.writing = false;
        Ok(())
    }

    fn watch(&mut self, writing: bool) -> bool {
        self.writing = writing;
        self.watched.is_some()
    }

    fn read(&mut self, parser: &mut Parser) -> io::Result<bool> {
        held(&mut self.socket)?.read(parser)
    }

    fn write(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        held(&mut self.socket)?.write(out)
    }

    fn close(&mut self) {
        // The watch goes before the socket it watches.
        self.watched = None;
        self.socket = None;
    }

    fn arm(&mut self, at: Option<Instant>) {
        self.deadline = at;
    }

    fn teardown(&mut self) {
        *self = TokioIo::default();
    }
}

/// What woke the task.
enum Woke {
    Calls(Option<Pipeline>),
    Connected(Result<Box<Socket>>),
    Ready(io::Result<Ready>),
    Timer,
}

/// The connection's task: runs until the last [`Node`] handle is gone.
async fn run(
    mut conn: Engine,
    mut calls: mpsc::UnboundedReceiver<Pipeline>,
    monitor: Arc<Monitor>,
) {
    loop {
        let TokioIo {
            connecting,
            watched,
            writing,
            deadline,
            ..
        } = &mut conn.io;
        let woke = {
            let mut connected = pin!(connected(connecting));
            let mut ready = pin!(ready(watched.as_ref(), *writing));
            let mut until = pin!(until(*deadline));
            poll_fn(|cx| {
                if let Poll::Ready(pipeline) = calls.poll_recv(cx) {
                    return Poll::Ready(Woke::Calls(pipeline));
                }
                if let Poll::Ready(result) = connected.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Connected(result.map(Box::new)));
                }
                if let Poll::Ready(ready) = ready.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Ready(ready));
                }
                until.as_mut().poll(cx).map(|()| Woke::Timer)
            })
            .await
        };
        // No panic may end the task with calls on it.
        let step = catch_unwind(AssertUnwindSafe(|| match woke {
            Woke::Calls(None) => false,
            Woke::Calls(Some(pipeline)) => {
                take(&mut conn, pipeline);
                while let Ok(pipeline) = calls.try_recv() {
                    take(&mut conn, pipeline);
                }
                conn.flush(Instant::now());
                true
            }
            Woke::Connected(result) => {
                conn.connected(result.map(|socket| *socket), Instant::now());
                true
            }
            Woke::Ready(Ok(ready)) => {
                let readable = ready.is_readable() || ready.is_read_closed();
                let writable = ready.is_writable() || ready.is_write_closed();
                conn.ready(readable, writable, Instant::now());
                true
            }
            Woke::Ready(Err(e)) => {
                conn.lost(&e.to_string(), Instant::now());
                true
            }
            Woke::Timer => {
                conn.handle_timeout(Instant::now());
                true
            }
        }));
        match step {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => conn.lost("a Rust panic was caught", Instant::now()),
        }
        deliver(&mut conn, &monitor);
    }
    conn.teardown();
    deliver(&mut conn, &monitor);
}

/// Hands a pipeline's calls to the engine, under a sink of their own.
fn take(conn: &mut Engine, pipeline: Pipeline) {
    let n = pipeline.requests.len();
    let sink = conn.join(Some(Gathered {
        results: (0..n).map(|_| None).collect(),
        slots: None,
        left: n,
        reply: Some(pipeline.reply),
    }));
    for (i, mut request) in pipeline.requests.into_iter().enumerate() {
        request.id = (sink as u64) << 32 | i as u64;
        if let Err(e) = conn.send(sink, request) {
            // Refused at once (backing off): it was not sent.
            if let Some(Some(gathered)) = conn.sinks[sink].as_mut().map(|s| s.to.as_mut()) {
                gathered.results[i] = Some(Err(e));
                gathered.left -= 1;
            }
        }
    }
}

/// Tells the connection's events, answers the pipelines whose calls have
/// all settled, moves the counts to the monitor, and re-arms the timer.
fn deliver(conn: &mut Engine, monitor: &Monitor) {
    for (id, reply) in std::mem::take(&mut conn.pipe.replies) {
        let (sink, i) = ((id >> 32) as usize, id as u32 as usize);
        let gathered = conn.sinks.get_mut(sink).and_then(Option::as_mut);
        let Some(gathered) = gathered.and_then(|s| s.to.as_mut()) else {
            continue;
        };
        if let Some(slot @ None) = gathered.results.get_mut(i) {
            *slot = Some(Ok((Answer::new(&[]), Vec::new())));
            gathered.slots = Some(reply);
            gathered.left -= 1;
        }
    }
    conn.route();
    // Told before the results that follow them, as on the event loop; a
    // cluster's monitor tells `connected` once for all its nodes.
    if let Some(events) = conn.sinks.get_mut(EVENTS).and_then(Option::as_mut) {
        for event in events.events.drain(..) {
            match event {
                Event::Connected | Event::Reconnected => {
                    monitor.opened();
                    monitor.up();
                }
                Event::Lost(code) => monitor.lost(code),
            }
        }
        events.done.clear();
    }
    let mut finished = Vec::new();
    for (i, slot) in conn.sinks.iter_mut().enumerate().skip(EVENTS + 1) {
        let Some(sink) = slot.as_mut() else { continue };
        sink.events.clear();
        let Some(gathered) = sink.to.as_mut() else {
            continue;
        };
        for Completion { id, result } in sink.done.drain(..) {
            let Some(slot) = gathered.results.get_mut(id as usize) else {
                continue;
            };
            match (slot.as_mut(), result) {
                // A step's further answers (see `pipe::MORE`).
                (Some(Ok((_, rest))), Ok(answer)) => rest.push(answer),
                (Some(_), _) => {}
                (None, result) => {
                    *slot = Some(result.map(|answer| (answer, Vec::new())));
                    gathered.left -= 1;
                }
            }
        }
        if gathered.left == 0 {
            if let Some(reply) = gathered.reply.take() {
                let results = std::mem::take(&mut gathered.results);
                let results = results
                    .into_iter()
                    .map(|r| r.unwrap_or(Err(Error::Internal("a call got no answer"))));
                let _ = reply.send(Settled {
                    results: results.collect(),
                    slots: gathered.slots.take(),
                });
            }
            finished.push(i);
        }
    }
    for sink in finished {
        conn.leave(sink);
    }
    // Connects, reconnects and losses were told through the events above.
    let tally = &mut conn.pipe.tally;
    (tally.connects, tally.reconnects, tally.losses) = (0, 0, 0);
    tally.move_into(&mut monitor.tally());
    conn.arm();
}

/// A connect's result, once it is in; never while none is under way.
async fn connected(connecting: &mut Option<oneshot::Receiver<Result<Socket>>>) -> Result<Socket> {
    let Some(rx) = connecting.as_mut() else {
        return pending().await;
    };
    let result = rx
        .await
        .unwrap_or(Err(Error::Internal("the connect thread ended")));
    *connecting = None;
    result
}

/// The socket's readiness to read (and to write, if `writing`); never while
/// no socket is watched.
async fn ready(watched: Option<&Watched>, writing: bool) -> io::Result<Ready> {
    let Some(watched) = watched else {
        return pending().await;
    };
    let interest = match writing {
        true => Interest::READABLE | Interest::WRITABLE,
        false => Interest::READABLE,
    };
    watched.ready(interest).await
}

/// Resolves at `at`; never if `None`.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => pending().await,
    }
}

/// A socket registered with tokio's reactor for its readiness only: the
/// engine's [`Socket`] does the reads and writes.
#[cfg(unix)]
struct Watched(tokio::io::unix::AsyncFd<Fd>);

#[cfg(unix)]
struct Fd(std::os::fd::RawFd);

#[cfg(unix)]
impl std::os::fd::AsRawFd for Fd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

#[cfg(unix)]
impl Watched {
    fn new(socket: &Socket) -> io::Result<Watched> {
        let interest = Interest::READABLE | Interest::WRITABLE;
        // SAFETY: the engine closes its watch (dropping this) before the
        // socket it watches: the descriptor stays open while this lives.
        let fd =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(Fd(socket.raw()), interest) };
        Ok(Watched(fd?))
    }

    /// Waits for `interest`, and clears what it found: the engine's reads
    /// take all that has come (each read that does not fill its buffer
    /// found the socket drained), and the reactor notes every arrival
    /// after, so no readiness is lost.
    async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        let mut guard = self.0.ready(interest).await?;
        let ready = guard.ready();
        guard.clear_ready();
        Ok(ready)
    }
}

/// On Windows, a second handle of the same socket, registered with tokio's
/// reactor for its readiness only.
#[cfg(windows)]
struct Watched(tokio::net::TcpStream);

#[cfg(windows)]
impl Watched {
    fn new(socket: &Socket) -> io::Result<Watched> {
        tokio::net::TcpStream::from_std(socket.watchable()?).map(Watched)
    }

    async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        let ready = self.0.ready(interest).await?;
        let _ = self
            .0
            .try_io(interest, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
        Ok(ready)
    }
}
