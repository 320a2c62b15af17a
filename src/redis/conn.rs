//! One connection to one server, as both hosts run it: its state (down,
//! connecting, up), the bytes it writes and reads when its host says the
//! socket is ready, the hits waiting for it, its pipeline (`pipe`),
//! timeouts, backoff, replacing a bad connection, and the routing of
//! results to the stores that share it. A host ([`Io`]) holds the socket,
//! watches it and keeps the timer: the binding does it with libuv's poll
//! and timer handles on Node's event loop, `host` with a tokio task on the
//! I/O thread, and each calls back into [`Conn::ready`], [`Conn::connected`]
//! and [`Conn::handle_timeout`].
//!
//! The connection and its pipeline read no clock: each call that acts on
//! time takes `now` from its host (a hit its `sent_at`), and
//! [`Conn::poll_timeout`] says when the host's timer is due, as in
//! quinn-proto's `Connection`. Its tests run on time as a value.
//!
//! Stores of one JS thread with the same server and credentials share one
//! connection: each has a [`Sink`] of its own (indexed by the high half of
//! a request's id), where its results wait for the host to deliver them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pipe::{Done, Pipe, Request, MORE};
use super::resp::Parser;
use super::socket::Target;
use super::stats::Event;
use super::Config;
use crate::delivery::Completion;
use crate::errors::Error;
use crate::health::{Backoff, Gate};

/// What a connection asks of the host that runs it. The host holds the
/// socket: the connection sees only the bytes it reads and writes.
pub trait Io {
    /// What a connect gives the host: an open, set-up connection.
    type Socket;
    /// Starts connecting to `target` off this thread; the host hands the
    /// result to [`Conn::connected`]. An error means it could not start.
    fn connect(&mut self, target: Arc<Target>, timeout: Duration) -> Result<(), Error>;
    /// Takes a new connection's socket and starts watching it.
    fn open(&mut self, socket: Self::Socket) -> Result<(), Error>;
    /// Watches the socket for answers, and for room to write if `writing`;
    /// false if it could not.
    fn watch(&mut self, writing: bool) -> bool;
    /// Reads all that has come into `parser`; false once the server closed.
    fn read(&mut self, parser: &mut Parser) -> std::io::Result<bool>;
    /// Writes as much of `out` as the socket takes now, draining it; true
    /// if all of it went.
    fn write(&mut self, out: &mut Vec<u8>) -> std::io::Result<bool>;
    /// Stops watching the socket and closes it.
    fn close(&mut self);
    /// Calls [`Conn::handle_timeout`] at `at`, or never (`None`): an armed timer
    /// is what keeps the process alive while hits are in flight.
    fn arm(&mut self, at: Option<Instant>);
    /// The connection ends: no callback may come after this.
    fn teardown(&mut self);
}

/// Where the connection is: no socket, one being opened, or one open.
enum Phase {
    Down,
    Connecting,
    Up {
        /// What the socket is watched for: None before it is, then
        /// whether for room to write too.
        writing: Option<bool>,
    },
}

/// One store's side of a shared connection: its results and events, for
/// the host to deliver, and what the host keeps to deliver them (`to`).
pub struct Sink<T> {
    pub to: T,
    pub done: Vec<Completion>,
    /// Connection events not yet handed to this store.
    pub events: Vec<Event>,
    /// Hits of this store whose promise has not settled.
    in_flight: usize,
    closed: bool,
}

pub struct Conn<I: Io, T> {
    pub io: I,
    target: Arc<Target>,
    /// What stores must match to share this connection.
    pub key: Config,
    connect_timeout: Duration,
    phase: Phase,
    pub pipe: Pipe,
    /// Hits waiting for the connection.
    waiting: VecDeque<Request>,
    /// Spaces out connects after failures.
    backoff: Backoff,
    /// The connection has answered something since it was opened.
    answered: bool,
    /// A connection has been open (so the next is a reconnect).
    was_up: bool,
    /// The target's epoch when the connect started (Sentinel: the
    /// failovers announced so far); a later one replaces the connection.
    epoch: u64,
    /// Results not yet routed to their store.
    done: Vec<Done>,
    pub sinks: Vec<Option<Sink<T>>>,
    torn_down: bool,
}

impl<I: Io, T> Conn<I, T> {
    /// A connection to `config`'s server, shared by the stores whose
    /// settings are `key`; `seed` draws its backoff's jitter (the host's
    /// randomness: the engine has none of its own).
    pub fn new(config: &Config, key: Config, io: I, seed: u64) -> Result<Self, Error> {
        Ok(Conn {
            io,
            target: Arc::new(Target::new(config)?),
            key,
            connect_timeout: Duration::from_millis(config.timeout_ms),
            phase: Phase::Down,
            pipe: Pipe::new(config.secrets(), config.fence()),
            waiting: VecDeque::new(),
            backoff: Backoff::new(seed),
            answered: false,
            was_up: false,
            epoch: 0,
            done: Vec::new(),
            sinks: Vec::new(),
            torn_down: false,
        })
    }

    pub fn torn_down(&self) -> bool {
        self.torn_down
    }

    /// A store joins: its sink's index.
    pub fn join(&mut self, to: T) -> usize {
        let sink = Sink {
            to,
            done: Vec::new(),
            events: Vec::new(),
            in_flight: 0,
            closed: false,
        };
        match self.sinks.iter().position(Option::is_none) {
            Some(free) => {
                self.sinks[free] = Some(sink);
                free
            }
            None => {
                self.sinks.push(Some(sink));
                self.sinks.len() - 1
            }
        }
    }

    /// Refuses the store's later hits; it lets go once its hits settle.
    pub fn close(&mut self, sink: usize) {
        if let Some(s) = self.sinks[sink].as_mut() {
            s.closed = true;
        }
        self.release_idle();
    }

    /// The store is gone: nobody waits for its results.
    pub fn leave(&mut self, sink: usize) {
        self.sinks[sink] = None;
        self.release_idle();
    }

    /// Queues a store's hit: on the pipeline, or until the connection is up.
    pub fn send(&mut self, sink: usize, request: Request) -> Result<(), Error> {
        match self.sinks[sink].as_ref() {
            Some(s) if !s.closed && !self.torn_down => {}
            _ => return Err(Error::Closed),
        }
        if matches!(self.phase, Phase::Up { .. }) && self.target.epoch() != self.epoch {
            // The sentinels announced a new master: this hit and the next
            // go to it. Hits still on the old connection reject.
            self.end("the sentinels announced a failover to a new master");
        }
        let idle = self.in_flight() == 0;
        match self.phase {
            Phase::Up { .. } => self.pipe.send(request),
            Phase::Connecting => self.waiting.push_back(request),
            Phase::Down => match self.backoff.gate(request.sent_at) {
                // Refused at once, unsent, while connects back off.
                Gate::Refuse(error) => return Err(error),
                Gate::Open | Gate::Probe => {
                    let now = request.sent_at;
                    self.waiting.push_back(request);
                    self.connect(now);
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

    fn connect(&mut self, now: Instant) {
        self.phase = Phase::Connecting;
        self.epoch = self.target.epoch();
        if let Err(error) = self
            .io
            .connect(Arc::clone(&self.target), self.connect_timeout)
        {
            self.connected(Err(error), now);
        }
    }

    /// A connect finished, at `now`.
    pub fn connected(&mut self, result: Result<I::Socket, Error>, now: Instant) {
        if self.torn_down {
            return;
        }
        match result.and_then(|socket| self.io.open(socket)) {
            Ok(()) => {
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
                self.phase = Phase::Up { writing: None };
                while let Some(request) = self.waiting.pop_front() {
                    self.pipe.send(request);
                }
                self.watch(false, now);
                self.flush(now);
            }
            Err(error) => {
                self.phase = Phase::Down;
                self.pipe.tally.connect_failures += 1;
                self.backoff.failed(now, error.clone());
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

    /// Writes what is queued, as far as the socket takes it at `now`.
    pub fn flush(&mut self, now: Instant) {
        let Phase::Up { .. } = self.phase else {
            return;
        };
        self.pipe.seal(now);
        if self.pipe.out.is_empty() {
            return;
        }
        match self.io.write(&mut self.pipe.out) {
            Ok(all) => self.watch(!all, now),
            Err(e) => self.lost(&e.to_string(), now),
        }
    }

    /// Watches for answers, and for room to write if `writing`; only a
    /// change goes to the host (restarting a watch costs system calls).
    fn watch(&mut self, writing: bool, now: Instant) {
        let Phase::Up { writing: was, .. } = &mut self.phase else {
            return;
        };
        if *was == Some(writing) {
            return;
        }
        *was = Some(writing);
        if !self.io.watch(writing) {
            self.lost("the event loop could not watch the socket", now);
        }
    }

    /// The socket is ready to be read and/or written, at `now`.
    pub fn ready(&mut self, readable: bool, writable: bool, now: Instant) {
        if writable {
            self.flush(now);
        }
        if !readable {
            return;
        }
        let Phase::Up { .. } = self.phase else {
            return;
        };
        let open = self.io.read(self.pipe.parser());
        match self.pipe.answers(&mut self.done, now) {
            Err(_) => return self.lost("Redis answered out of protocol", now),
            Ok(health) => {
                if health.unusable {
                    // A demoted primary (or one still loading): a new
                    // connection finds the server the name points to now,
                    // after a backoff, as for a failed connect.
                    let why =
                        "the server can no longer take writes (READONLY, MASTERDOWN or LOADING)";
                    self.end(why);
                    self.backoff.failed(
                        now,
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
            Ok(false) => return self.lost("the server closed the connection", now),
            Err(e) => return self.lost(&e.to_string(), now),
        }
        // NOSCRIPT retries go out at once.
        self.flush(now);
    }

    /// The connection failed: every hit on it rejects; the next hit connects
    /// anew. One that ends before it answered anything counts as a failed
    /// connect for the backoff.
    pub fn lost(&mut self, why: &str, now: Instant) {
        if !self.answered {
            let error = self.end(why);
            self.backoff.failed(now, error);
            return;
        }
        self.end(why);
    }

    fn end(&mut self, why: &str) -> Error {
        let error = Error::Connection {
            text: format!(
                "the connection to Redis failed ({why}); the call was not sent again and may or may not have counted"
            ),
            sent: true,
        };
        self.pipe.fail(&error, &mut self.done);
        self.drop_socket();
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

    fn drop_socket(&mut self) {
        if let Phase::Up { .. } = std::mem::replace(&mut self.phase, Phase::Down) {
            // The host stops watching and closes the socket.
            self.io.close();
        }
    }

    /// When [`Conn::handle_timeout`] is due: the earliest deadline, or
    /// never when idle (or when only hits settled by a timeout remain: a
    /// stuck connection must not keep the process alive).
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Hits wait in the order they were sent, and the stores sharing a
        // connection share its timeoutMs (it is part of the connection's
        // key), so the front is due first, as the pipeline's is; the queue
        // is short and waits only while connecting, so it is read whole.
        let waiting = self.waiting.iter().map(|r| r.deadline).min();
        [self.pipe.next_deadline(), waiting]
            .into_iter()
            .flatten()
            .min()
    }

    /// Asks the host for [`Conn::handle_timeout`] at [`Conn::poll_timeout`].
    pub fn arm(&mut self) {
        if self.torn_down {
            return;
        }
        let next = self.poll_timeout();
        self.io.arm(next);
    }

    /// The time is `now`: the hits whose deadlines passed reject.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Any waiting hit may be due (see `poll_timeout`).
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
            self.lost("no answer within timeoutMs", now);
        }
    }

    /// What it connects to (for the tests, which announce a failover on it).
    #[cfg(test)]
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Routes results to their stores' sinks.
    pub fn route(&mut self) {
        for done in self.done.drain(..) {
            // A step's further answers settle nothing more.
            let more = done.id & MORE != 0;
            let (sink, id) = (((done.id & !MORE) >> 32) as usize, done.id as u32);
            if let Some(Some(sink)) = self.sinks.get_mut(sink) {
                if !more {
                    sink.in_flight = sink.in_flight.saturating_sub(1);
                }
                sink.done.push(Completion {
                    id,
                    result: done.result,
                });
            }
        }
    }

    /// Frees the sinks of closed stores with nothing in flight, and ends
    /// the connection once no store uses it.
    pub fn release_idle(&mut self) {
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

    /// Ends the connection: nothing is sent, and no callback comes, after.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut done = Vec::new();
        self.pipe.fail(&Error::Closed, &mut done);
        self.waiting.clear();
        self.drop_socket();
        self.target.stop_watching();
        self.io.teardown();
    }
}

impl<I: Io, T> Drop for Conn<I, T> {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Answer, Op};
    use crate::redis::config::Options;
    use crate::redis::pair::Fake;
    use crate::redis::pipe::Route;
    use crate::redis::resp::Value;

    /// The commands the connection wrote since the last call, each as its words.
    fn commands(c: &mut Conn<Fake, ()>) -> Vec<Vec<String>> {
        let mut parser = Parser::default();
        parser.feed(&std::mem::take(&mut c.io.sent));
        let mut all = Vec::new();
        while let Some(Value::Array(Some(parts))) = parser.next().unwrap() {
            let word = |v: &Value| match v {
                Value::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            all.push(parts.iter().map(word).collect());
        }
        all
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A connection to `url` on the in-memory host, one store joined (its
    /// sink), and the instant its test's time starts at.
    fn joined(url: &str) -> (Conn<Fake, ()>, usize, Instant) {
        let mut c = conn(url);
        let sink = c.join(());
        (c, sink, Instant::now())
    }

    fn conn(url: &str) -> Conn<Fake, ()> {
        let options = Options {
            url: Some(url.into()),
            timeout_ms: Some(1_000),
            ..Options::default()
        };
        let config = Config::resolve(&options, |_| None).unwrap();
        Conn::new(&config, config.clone(), Fake::default(), 7).unwrap()
    }

    fn request(id: u64, timeout: Duration) -> Request {
        let now = Instant::now();
        Request {
            id,
            op: Op::Hit,
            args: [60_000, 1, 0, 0],
            key: b"p:k".to_vec().into_boxed_slice(),
            sent_at: now,
            deadline: now + timeout,
            route: Route::Direct,
        }
    }

    fn results(c: &mut Conn<Fake, ()>, sink: usize) -> Vec<Completion> {
        c.route();
        std::mem::take(&mut c.sinks[sink].as_mut().unwrap().done)
    }

    #[test]
    fn a_failed_connect_rejects_the_waiting_hits_unsent_and_backs_off() {
        let (mut c, sink, _) = joined("redis://127.0.0.1:1");
        c.send(sink, request(1, Duration::from_secs(1))).unwrap();
        assert_eq!(c.io.connects.len(), 1, "the first hit connects");
        assert!(c.io.armed[0].is_some(), "a hit in flight arms the timer");
        let refused = Error::Connection {
            text: "refused".into(),
            sent: false,
        };
        c.connected(Err(refused.clone()), Instant::now());
        let done = results(&mut c, sink);
        assert_eq!((done.len(), done[0].id), (1, 1));
        assert_eq!(done[0].result.as_ref().unwrap_err().sent(), Some(false));
        // Backing off: the next hit is refused at once, with no connect.
        let again = c.send(sink, request(2, Duration::from_secs(1)));
        assert_eq!(again.unwrap_err().code(), "ERR_CONNECTION");
        assert_eq!(c.io.connects.len(), 1);
        assert_eq!(c.pipe.tally.connect_failures, 1);
    }

    #[test]
    fn a_hit_waiting_for_the_connection_times_out_unsent() {
        let (mut c, sink, _) = joined("redis://127.0.0.1:1");
        c.send(sink, request(7, Duration::ZERO)).unwrap();
        c.handle_timeout(Instant::now());
        let done = results(&mut c, sink);
        assert_eq!(done[0].result, Err(Error::Timeout { ms: 0, sent: false }));
        assert_eq!(c.pipe.tally.timeouts, 1);
    }

    /// A hit sent at `at`, due `timeout` later.
    fn request_at(id: u64, at: Instant, timeout: Duration) -> Request {
        Request {
            sent_at: at,
            deadline: at + timeout,
            ..request(id, timeout)
        }
    }

    #[test]
    fn time_is_a_value_the_host_passes_in_the_timer_is_the_earliest_deadline() {
        let (mut c, sink, t0) = joined("redis://127.0.0.1:1");
        assert_eq!(c.poll_timeout(), None, "idle: no timer");
        c.send(sink, request_at(1, t0, ms(1_000))).unwrap();
        c.send(sink, request_at(2, t0 + ms(10), ms(300))).unwrap();
        // Waiting for the connection: the earliest waiting deadline, even where it is not the front's.
        // The first hit armed the timer; the host re-arms after each event.
        assert_eq!(c.poll_timeout(), Some(t0 + ms(310)));
        c.arm();
        assert_eq!(c.io.armed, [Some(t0 + ms(1_000)), Some(t0 + ms(310))]);
        // Nothing is due a microsecond early, whatever the wall clock says.
        c.handle_timeout(t0 + ms(309));
        assert!(results(&mut c, sink).is_empty());
        c.handle_timeout(t0 + ms(310));
        let done = results(&mut c, sink);
        assert_eq!((done.len(), done[0].id), (1, 2));
        assert_eq!(
            done[0].result,
            Err(Error::Timeout {
                ms: 300,
                sent: false
            })
        );
        c.handle_timeout(t0 + ms(1_000));
        let done = results(&mut c, sink);
        assert_eq!((done.len(), done[0].id), (1, 1));
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(c.pipe.tally.timeouts, 2);
    }

    #[test]
    fn a_failed_connect_backs_off_from_the_time_it_failed_at() {
        let (mut c, sink, t0) = joined("redis://127.0.0.1:1");
        c.send(sink, request_at(1, t0, ms(1_000))).unwrap();
        let refused = Error::Connection {
            text: "refused".into(),
            sent: false,
        };
        c.connected(Err(refused), t0 + ms(5));
        results(&mut c, sink);
        // The first delay is drawn from [50, 100] ms after the failure: refused before, a probe after.
        let early = c.send(sink, request_at(2, t0 + ms(54), ms(1_000)));
        assert_eq!(early.unwrap_err().code(), "ERR_CONNECTION");
        assert_eq!(c.io.connects.len(), 1);
        c.send(sink, request_at(3, t0 + ms(105), ms(1_000)))
            .unwrap();
        assert_eq!(
            c.io.connects.len(),
            2,
            "a probe connects once the delay has passed"
        );
    }

    #[test]
    fn the_connection_ends_with_its_last_store() {
        let mut c = conn("redis://127.0.0.1:1");
        let (a, b) = (c.join(()), c.join(()));
        c.close(a);
        assert_eq!(
            c.send(a, request(1, Duration::from_secs(1))),
            Err(Error::Closed)
        );
        assert_eq!(c.io.torn_down, 0, "b still uses it");
        c.leave(b);
        assert!(c.torn_down());
        assert_eq!(c.io.torn_down, 1);
        assert_eq!(c.join(()), 0, "a freed sink is used again");
    }

    #[test]
    fn a_hit_goes_out_as_bytes_and_its_answer_comes_back_as_bytes() {
        let (mut c, sink, t0) = joined("redis://127.0.0.1:1");
        c.send(sink, request_at(3, t0, ms(5_000))).unwrap();
        assert_eq!(c.io.connects.len(), 1);
        assert!(
            c.io.sent.is_empty(),
            "nothing is written before the connection is up"
        );
        c.connected(Ok(()), t0 + ms(1));
        assert_eq!((c.io.opened, c.io.watching[0]), (1, false));
        assert_eq!(c.pipe.tally.connects, 1);
        // The first hit loads the script: EVAL, its key, and the hit's numbers.
        let sent = commands(&mut c);
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0][0].as_str(), sent[0][2].as_str()), ("EVAL", "1"));
        assert_eq!(&sent[0][3..], ["p:k", "60000", "1"]);
        // Half an answer settles nothing; the rest does.
        c.io.inbox.extend_from_slice(b"*2\r\n:1\r\n:6");
        c.ready(true, false, t0 + ms(2));
        assert!(results(&mut c, sink).is_empty());
        c.io.inbox.extend_from_slice(b"0000\r\n");
        c.ready(true, false, t0 + ms(3));
        let done = results(&mut c, sink);
        assert_eq!(done[0].id, 3);
        assert_eq!(done[0].result, Ok(Answer::new(&[1, 60_000])));
        assert_eq!(c.sinks[sink].as_ref().unwrap().events, [Event::Connected]);
        // The server closes: the connection is lost, and the next hit connects anew.
        c.io.hung_up = true;
        c.ready(true, false, t0 + ms(4));
        assert_eq!((c.io.closed, c.pipe.tally.losses), (1, 1));
        c.send(sink, request_at(4, t0 + ms(5), ms(5_000))).unwrap();
        assert_eq!(c.io.connects.len(), 2);
    }

    #[test]
    fn a_failover_the_sentinels_announce_replaces_the_connection_before_the_next_hit() {
        let (mut c, sink, t0) = joined("redis+sentinel://127.0.0.1:1/mymaster");
        c.send(sink, request_at(1, t0, ms(5_000))).unwrap();
        c.connected(Ok(()), t0 + ms(1));
        assert_eq!(
            commands(&mut c).len(),
            1,
            "hit 1 is on the old master's connection"
        );
        c.target.announce_switch();
        c.send(sink, request_at(2, t0 + ms(2), ms(5_000))).unwrap();
        // Hit 1 rejects (sent: it may have counted on the old master); hit 2 waits for a new connect.
        let done = results(&mut c, sink);
        assert_eq!(done.len(), 1);
        let error = done[0].result.as_ref().unwrap_err();
        assert_eq!(
            (done[0].id, error.code(), error.sent()),
            (1, "ERR_CONNECTION", Some(true))
        );
        assert!(error.to_string().contains("failover"), "{error}");
        assert_eq!((c.io.closed, c.io.connects.len()), (1, 2));
        assert!(
            c.io.sent.is_empty(),
            "hit 2 is not written to the old master"
        );
        c.connected(Ok(()), t0 + ms(3));
        assert_eq!(
            commands(&mut c).len(),
            1,
            "hit 2 goes to the new connection"
        );
        assert_eq!(
            c.sinks[sink].as_ref().unwrap().events,
            [
                Event::Connected,
                Event::Lost("ERR_CONNECTION"),
                Event::Reconnected
            ]
        );
    }

    #[test]
    fn what_the_socket_does_not_take_waits_for_room_to_write() {
        let (mut c, sink, t0) = joined("redis://127.0.0.1:1");
        c.io.room = Some(10);
        c.send(sink, request_at(1, t0, ms(5_000))).unwrap();
        c.connected(Ok(()), t0);
        assert_eq!(
            c.io.watching,
            [false, true],
            "watched for room once a write fell short"
        );
        assert_eq!(c.io.sent.len(), 10);
        // Room again: the rest goes, and the watch is for answers only.
        c.io.room = None;
        c.ready(false, true, t0 + ms(1));
        assert_eq!(c.io.watching, [false, true, false]);
        assert_eq!(
            commands(&mut c).len(),
            1,
            "one whole command, in two writes"
        );
    }
}
