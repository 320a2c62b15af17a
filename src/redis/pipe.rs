//! One connection's pipeline, on both hosts (the event loop and the I/O
//! thread): each op encoded
//! as EVALSHA of its script (or its command) into the bytes to write, and
//! replies matched to them in order as they are read. No I/O here: the
//! connection (`conn`) moves the bytes when its host says the socket is
//! ready.
//!
//! Ops on one key take effect in the order they were sent, NOSCRIPT
//! included (see "Order of calls" in docs/algorithms.md): a script goes as
//! EVAL the first time this connection sends it (so a server that never ran
//! it, after a restart or a failover, never answers NOSCRIPT while a later
//! op of another script runs), and after a NOSCRIPT (the cache was
//! flushed; the script did not run) nothing more is written until every op
//! written before it has answered; then the ops that met NOSCRIPT go again
//! as EVAL, in their order, ahead of the ops held meanwhile. An UNLINK (a
//! reset), which can't meet NOSCRIPT, waits the same way for the EVALSHAs
//! written before it. Nothing else is ever sent again.
//!
//! With a [`Fence`] (`waitForReplicas`), a batch written ends with `WAIT`
//! unless one is out already (then the ops written meanwhile get the next
//! one, written once it answers), and an op's answer is held until the
//! first `WAIT` written after it answers: enough replicas, and it is given;
//! fewer (or an error), and the op rejects [`Error::Unconfirmed`] (or
//! [`Error::WaitRefused`]), since the count it made on the master may be
//! lost by a failover.

use std::collections::VecDeque;
use std::time::Instant;

use super::calls::{passes, waits_behind_evalsha, Loaded, Query};
use super::fence::{Fence, Verdict};
use super::reply::{self, Answers, Code};
use super::resp::{self, Malformed, Parser, Value};
use super::stats::Tally;
use super::step;
use crate::errors::{Error, Result};
use crate::health::{Mark, Stall};
use crate::ops::{Answer, Args, Op};

/// An op to send: its id, its state's key (prefix and suffix included) and
/// numbers.
pub struct Request {
    /// The caller's: which store and which of its calls.
    pub id: u64,
    pub op: Op,
    pub args: Args,
    pub key: Box<[u8]>,
    pub sent_at: Instant,
    pub deadline: Instant,
    pub route: Route,
}

/// How a request goes on the wire besides its op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Route {
    #[default]
    Direct,
    /// After `ASKING`: a Redis Cluster's redirection of one call to a node
    /// that imports its slot.
    Asking,
    /// `CLUSTER SLOTS` (the op is ignored), whose reply is kept whole in
    /// [`Pipe::replies`].
    Slots,
}

/// An op's result, by its request's id.
pub struct Done {
    pub id: u64,
    pub result: Result<Answer>,
}

struct Sent {
    request: Request,
    /// Already rejected (it timed out): its reply, when it comes, is dropped.
    settled: bool,
    eval: bool,
    /// An `ASKING` went before it: its reply comes first.
    asked: bool,
    /// What the connection had answered when the op was handed over.
    mark: Mark,
}

/// What the replies read so far say about the connection.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Health {
    /// Some hit got a reply.
    pub answered: bool,
    /// The server can't take writes here (READONLY, MASTERDOWN, LOADING):
    /// the connection should be replaced.
    pub unusable: bool,
}

pub struct Pipe {
    secrets: Vec<Vec<u8>>,
    /// Bytes waiting to be written.
    pub out: Vec<u8>,
    /// Written, in order, waiting for their replies.
    sent: VecDeque<Sent>,
    /// Ops that met NOSCRIPT, in order, to go again as EVAL once `sent`
    /// has drained (all older than `sent`).
    retry: VecDeque<Sent>,
    /// Ops handed over after a NOSCRIPT, or behind an UNLINK that waits
    /// for `sent`'s EVALSHAs, written in order after `retry`.
    held: VecDeque<Sent>,
    /// How many of `sent` went as EVALSHA (and so may meet NOSCRIPT).
    evalsha: usize,
    loaded: Loaded,
    /// How many of the ops above are not settled yet, kept as they change.
    unsettled: usize,
    parser: Parser,
    /// Tells a stuck connection from slow hits.
    stall: Stall,
    /// What this connection's calls met, over its life.
    pub tally: Tally,
    /// `waitForReplicas`, if set, and its state.
    fence: Option<Fence>,
    /// Ops written (their replies to come) since the connection opened.
    written: u64,
    /// Op replies read since the connection opened.
    read: u64,
    /// The `WAIT` out, if any: `written` when it was (its reply comes once
    /// `read` reaches that), and how long it waits.
    wait: Option<(u64, u64)>,
    /// `written` when the last `WAIT` was: the ops written since need one.
    sealed: u64,
    /// Answered ops (and their results) waiting for the next `WAIT`'s reply.
    confirming: VecDeque<(Sent, Result<Answers>)>,
    /// The replies of [`Route::Slots`] requests, by id, for the host to take.
    pub replies: Vec<(u64, Value)>,
}

impl Pipe {
    pub fn new(secrets: Vec<Vec<u8>>, fence: Option<Fence>) -> Pipe {
        Pipe {
            fence,
            written: 0,
            read: 0,
            wait: None,
            sealed: 0,
            confirming: VecDeque::new(),
            replies: Vec::new(),
            secrets,
            out: Vec::new(),
            sent: VecDeque::new(),
            retry: VecDeque::new(),
            held: VecDeque::new(),
            evalsha: 0,
            loaded: Loaded::default(),
            unsettled: 0,
            parser: Parser::default(),
            stall: Stall::default(),
            tally: Tally::default(),
        }
    }

    /// Hits handed over whose reply has not come (timed-out ones included).
    pub fn in_flight(&self) -> usize {
        self.confirming.len() + self.sent.len() + self.retry.len() + self.held.len()
    }

    /// Hits sent that are still waiting for their result.
    pub fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// Every op not answered yet, oldest first.
    fn queued(&self) -> impl Iterator<Item = &Sent> {
        let confirming = self.confirming.iter().map(|(sent, _)| sent);
        confirming
            .chain(&self.retry)
            .chain(&self.sent)
            .chain(&self.held)
    }

    /// Encodes a hit for sending (or holds it while NOSCRIPT retries wait).
    pub fn send(&mut self, request: Request) {
        self.unsettled += 1;
        let sent = Sent {
            request,
            settled: false,
            eval: false,
            asked: false,
            mark: self.stall.mark(),
        };
        self.held.push_back(sent);
        self.release();
    }

    /// Writes what may go now: the NOSCRIPT retries once `sent` has drained,
    /// then held ops in order, up to an UNLINK that would overtake an EVALSHA.
    fn release(&mut self) {
        if !self.retry.is_empty() {
            if !self.sent.is_empty() {
                return;
            }
            for sent in std::mem::take(&mut self.retry) {
                self.tally.noscript += 1;
                self.write(sent, true);
            }
        }
        while let Some(next) = self.held.front() {
            let op = next.request.op;
            let eval = op.script().is_some_and(|script| !self.loaded.has(script));
            if waits_behind_evalsha(op, eval) && self.evalsha > 0 {
                return;
            }
            if let Some(sent) = self.held.pop_front() {
                self.write(sent, false);
            }
        }
    }

    /// Encodes `sent` (as EVAL if `eval` or its script's first use) and
    /// waits for its reply.
    fn write(&mut self, mut sent: Sent, eval: bool) {
        let request = &sent.request;
        let out = &mut self.out;
        let key: &[u8] = &request.key;
        if request.route == Route::Asking {
            resp::encode(out, &[b"ASKING"]);
            sent.asked = true;
        }
        match request.op.script() {
            _ if request.route == Route::Slots => resp::encode(out, &[b"CLUSTER", b"SLOTS"]),
            None if request.op == Op::Ping => resp::encode(out, &[b"PING"]),
            None => resp::encode(out, &[b"UNLINK", key]),
            Some(script) if request.op == Op::Takes => {
                sent.eval = self.loaded.first_use(script) || eval;
                step::command(key, |n, keys, argv| {
                    let head: [&[u8]; 3] = match sent.eval {
                        false => [b"EVALSHA", script.sha().as_bytes(), n],
                        true => [b"EVAL", script.body.as_bytes(), n],
                    };
                    let parts: Vec<&[u8]> =
                        head.iter().copied().chain(keys.iter().copied()).collect();
                    resp::encode_parts(out, &parts, argv);
                });
                self.evalsha += usize::from(!sent.eval);
            }
            Some(script) => {
                sent.eval = self.loaded.first_use(script) || eval;
                request.op.argv(&request.args, |argv| {
                    let head: [&[u8]; 4] = match sent.eval {
                        false => [b"EVALSHA", script.sha().as_bytes(), b"1", key],
                        true => [b"EVAL", script.body.as_bytes(), b"1", key],
                    };
                    resp::encode_parts(out, &head, argv);
                });
                self.evalsha += usize::from(!sent.eval);
            }
        }
        self.sent.push_back(sent);
        self.written += 1;
    }

    /// Ends what `out` holds with `WAIT` if there is a fence, no `WAIT` is
    /// out, and an op was written since the last one: called right before
    /// `out` is written. It waits no longer than the earliest deadline of
    /// the ops it covers allows.
    pub fn seal(&mut self, now: Instant) {
        let Some(fence) = self.fence else {
            return;
        };
        if self.wait.is_some() || self.sealed == self.written {
            return;
        }
        let covered = self.confirming.iter().map(|(sent, _)| sent);
        let earliest = covered
            .chain(&self.sent)
            .filter(|s| !s.settled)
            .map(|s| s.request.deadline)
            .min();
        let ms = fence.wait_ms(now, earliest);
        let (mut replicas, mut timeout) = ([0; 20], [0; 20]);
        resp::encode(
            &mut self.out,
            &[
                b"WAIT",
                resp::digits(i64::from(fence.replicas), &mut replicas),
                resp::digits(i64::try_from(ms).unwrap_or(i64::MAX), &mut timeout),
            ],
        );
        self.wait = Some((self.written, ms));
        self.sealed = self.written;
    }

    /// Adds bytes read from the socket.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.feed(bytes);
    }

    pub fn parser(&mut self) -> &mut Parser {
        &mut self.parser
    }

    /// Matches every whole reply read so far to its hit, at `now`.
    pub fn answers(
        &mut self,
        done: &mut Vec<Done>,
        now: Instant,
    ) -> std::result::Result<Health, Malformed> {
        let mut health = Health::default();
        let mut in_time = false;
        while let Some(reply) = self.parser.next()? {
            if let Some((_, ms)) = self.wait.filter(|(at, _)| *at == self.read) {
                self.wait = None;
                health.answered = true;
                if self.confirmed(reply, ms, done, now) {
                    health.unusable = true;
                }
                continue;
            }
            if let Some(asking) = self.sent.front_mut().filter(|s| s.asked) {
                asking.asked = false; // ASKING's OK: the op's reply follows.
                continue;
            }
            let Some(sent) = self.sent.pop_front() else {
                return Err(Malformed); // A reply nothing asked for.
            };
            self.read += 1;
            if !sent.eval && sent.request.op.script().is_some() {
                self.evalsha -= 1;
            }
            health.answered = true;
            if sent.request.route == Route::Slots {
                if !sent.settled {
                    self.unsettled -= 1;
                    self.replies.push((sent.request.id, reply));
                }
                continue;
            }
            if let Value::Error(code, detail) = &reply {
                if let Some(error) = redirection(code, detail) {
                    // The script did not run: the cluster sends it on.
                    if !sent.settled {
                        self.unsettled -= 1;
                        push(done, sent.request.id, Err(error));
                    }
                    continue;
                }
                if Code::of(code) == Code::NoScript && !sent.eval {
                    // The script did not run: it goes again as EVAL, in
                    // turn, once what was written before it has answered.
                    self.loaded.forget();
                    self.retry.push_back(sent);
                    continue;
                }
                if Code::of(code).demotion() {
                    health.unusable = true;
                }
            }
            if !self.retry.is_empty() && sent.request.op != Op::Ping {
                self.overtaken(&sent.request, done);
            }
            if !sent.settled {
                in_time = true;
                let result =
                    outcomes(&sent.request, reply).map_err(|e| self.redact(e, &sent.request));
                if self.fence.is_some() && result.is_ok() {
                    // Given once the replicas confirm it.
                    self.confirming.push_back((sent, result));
                    continue;
                }
                self.unsettled -= 1;
                self.tally
                    .answered(now.saturating_duration_since(sent.request.sent_at));
                push(done, sent.request.id, result);
            }
        }
        if in_time {
            self.stall.answered();
        }
        self.release();
        Ok(health)
    }

    /// A `WAIT` that waited up to `ms` answered: the ops answered before it
    /// are given if enough replicas confirmed them, else they reject (they
    /// ran on the master). Answers whether the server was demoted.
    fn confirmed(&mut self, reply: Value, ms: u64, done: &mut Vec<Done>, now: Instant) -> bool {
        let Some(fence) = self.fence else {
            return false;
        };
        let verdict = fence.verdict(read(&reply), ms);
        for (sent, result) in std::mem::take(&mut self.confirming) {
            if sent.settled {
                continue;
            }
            self.unsettled -= 1;
            let result = match &verdict {
                Verdict::Confirmed => {
                    self.tally
                        .answered(now.saturating_duration_since(sent.request.sent_at));
                    result
                }
                Verdict::Rejected { error, .. } => {
                    self.tally.unconfirmed += 1;
                    Err(self.redact(error.clone(), &sent.request))
                }
            };
            push(done, sent.request.id, result);
        }
        matches!(verdict, Verdict::Rejected { demoted: true, .. })
    }

    /// An op on `key` ran while older ops on it wait to go again after
    /// NOSCRIPT: another client loaded the script meanwhile. Sent again,
    /// they would take effect after it, so they reject, unsent (see
    /// [`calls::overtaken`](super::calls::overtaken)).
    fn overtaken(&mut self, ran: &Request, done: &mut Vec<Done>) {
        let mut settled = 0;
        let ran = ran.query();
        self.retry.retain(|r| {
            if !passes(&ran, &r.request.query()) {
                return true;
            }
            if !r.settled {
                settled += 1;
                done.push(Done {
                    id: r.request.id,
                    result: Err(Error::Overtaken),
                });
            }
            false
        });
        self.unsettled -= settled;
    }

    /// Rejects the hits whose deadline has passed; their replies are
    /// dropped when they come. Answers whether the connection is stuck and
    /// must be replaced (see [`Stall`]): it answered nothing since the
    /// oldest of them was handed over, or [`crate::health::TIMEOUTS_BEFORE_REPLACING`]
    /// timed out in a row.
    pub fn expire(&mut self, now: Instant, done: &mut Vec<Done>) -> bool {
        let mut expired = 0;
        let mut oldest = None;
        let confirming = self.confirming.iter_mut().map(|(sent, _)| sent);
        let written = confirming.chain(&mut self.retry).chain(&mut self.sent);
        // Held ops were never written: they go unsent.
        let queued = written
            .map(|s| (s, true))
            .chain(self.held.iter_mut().map(|s| (s, false)));
        // Not in deadline order across the queues (a NOSCRIPT retry is older
        // than answers held behind a fence): each is looked at.
        for (sent, written) in queued.filter(|(s, _)| !s.settled && s.request.deadline <= now) {
            sent.settled = true;
            oldest = Some(oldest.map_or(sent.mark, |m: Mark| m.min(sent.mark)));
            expired += 1;
            let ms = sent
                .request
                .deadline
                .saturating_duration_since(sent.request.sent_at)
                .as_millis() as u64;
            done.push(Done {
                id: sent.request.id,
                result: Err(Error::Timeout { ms, sent: written }),
            });
        }
        self.held.retain(|s| !s.settled);
        self.unsettled -= expired;
        self.tally.timeouts += expired as u64;
        oldest.is_some_and(|mark| self.stall.timed_out(mark, expired))
    }

    /// The earliest deadline of a hit not yet settled.
    pub fn next_deadline(&self) -> Option<Instant> {
        let mut unsettled = self.queued().filter(|s| !s.settled);
        if self.confirming.is_empty() && self.retry.is_empty() {
            // Sent in order, with one timeout for all: the first is the earliest.
            return unsettled.next().map(|s| s.request.deadline);
        }
        unsettled.map(|s| s.request.deadline).min()
    }

    /// The connection is gone: every hit on it rejects with `error`, which
    /// says whether they were sent. Nothing is sent again.
    pub fn fail(&mut self, error: &Error, done: &mut Vec<Done>) {
        let confirming = self.confirming.drain(..).map(|(sent, _)| sent);
        let all = confirming
            .chain(self.retry.drain(..))
            .chain(self.sent.drain(..))
            .chain(self.held.drain(..));
        for sent in all {
            if !sent.settled {
                let e = error.clone();
                done.push(Done {
                    id: sent.request.id,
                    result: Err(e),
                });
            }
        }
        self.unsettled = 0;
        self.evalsha = 0;
        (self.written, self.read, self.sealed) = (0, 0, 0);
        self.wait = None;
        self.out.clear();
        self.parser = Parser::default();
        // The next connection may reach a server that never ran a script.
        self.loaded.forget();
        self.stall.reset();
    }

    fn redact(&self, error: Error, request: &Request) -> Error {
        let mut secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
        secrets.extend(request.query().keys());
        error.redacted(&secrets)
    }
}

impl Request {
    /// The op as every transport sees it.
    pub fn query(&self) -> Query<'_> {
        Query {
            key: &self.key,
            op: self.op,
            args: self.args,
        }
    }
}

/// A MOVED or ASK reply, as the error that names the node to go to.
fn redirection(code: &str, detail: &str) -> Option<Error> {
    let asking = match Code::of(code) {
        Code::Moved => false,
        Code::Ask => true,
        _ => return None,
    };
    let mut words = detail.split(' ');
    let (slot, to) = (words.next()?, words.next()?);
    Some(Error::Redirected {
        slot: slot.into(),
        to: to.into(),
        asking,
    })
}

/// Marks the id of a step's answer after its first: the same call, which
/// counts as settled once (by its first result).
pub const MORE: u64 = 1 << 63;

/// The results of one answered op: a step's one per take, all under its id
/// (each after the first marked [`MORE`]).
fn push(done: &mut Vec<Done>, id: u64, result: Result<Answers>) {
    match result {
        Ok((first, rest)) => {
            done.push(Done {
                id,
                result: Ok(first),
            });
            done.extend(rest.into_iter().map(|answer| Done {
                id: id | MORE,
                result: Ok(answer),
            }));
        }
        Err(e) => done.push(Done { id, result: Err(e) }),
    }
}

/// The op's answers, or the error its script raised.
fn outcomes(request: &Request, reply: Value) -> Result<Answers> {
    reply::outcomes(request.op, &request.key, read(&reply))
}

/// A RESP reply as every transport reads it.
fn read(reply: &Value) -> reply::Reply<'_> {
    match reply {
        Value::Array(Some(items)) => reply::Reply::Array(
            items
                .iter()
                .map(|r| match r {
                    Value::Int(n) => Some(*n),
                    _ => None,
                })
                .collect(),
        ),
        Value::Int(n) => reply::Reply::Int(*n),
        Value::Error(code, detail) => {
            reply::Reply::Error(code, (!detail.is_empty()).then_some(detail.as_str()))
        }
        _ => reply::Reply::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The tests' clock: a fixed instant, and times as offsets from it (the
    /// pipe reads no clock of its own).
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    /// A hit sent 2 s before its deadline.
    fn request(id: u64, key: &str, deadline: Instant) -> Request {
        Request {
            id,
            op: Op::Hit,
            args: [60_000, 1, 0, 0],
            key: key.as_bytes().into(),
            sent_at: deadline - Duration::from_secs(2),
            deadline,
            route: Route::Direct,
        }
    }

    fn pipe() -> Pipe {
        Pipe::new(vec![b"hunter2".to_vec()], None)
    }

    /// The commands `out` holds, each as its first word and its key.
    fn written(p: &mut Pipe) -> Vec<(String, String)> {
        let mut parser = Parser::default();
        parser.feed(&std::mem::take(&mut p.out));
        let mut all = Vec::new();
        while let Some(Value::Array(Some(parts))) = parser.next().unwrap() {
            let word = |i: usize| match parts.get(i) {
                Some(Value::Bulk(Some(b))) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            // A command and its key; a WAIT and its time.
            let second = if word(0) == "WAIT" { word(2) } else { word(3) };
            all.push((word(0), second));
        }
        all
    }

    fn cmd(word: &str, key: &str) -> (String, String) {
        (word.into(), key.into())
    }

    /// A pipe whose hit 1 on "a" was sent (loading the window script) and
    /// answered, and the results so far.
    fn warmed(deadline: Instant) -> (Pipe, Vec<Done>) {
        let mut p = pipe();
        p.send(request(1, "a", deadline));
        let mut done = Vec::new();
        p.feed(b"*2\r\n:1\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        written(&mut p);
        (p, done)
    }

    /// A pipe whose answers wait for one replica's `WAIT`, 500 ms.
    fn fenced() -> Pipe {
        let fence = Fence {
            replicas: 1,
            timeout_ms: 500,
        };
        Pipe::new(vec![b"hunter2".to_vec()], Some(fence))
    }

    const ANSWER: &[u8] = b"*2\r\n:1\r\n:60000\r\n";

    #[test]
    fn a_fence_writes_one_wait_at_a_time_and_holds_the_answers_until_it_answers() {
        let far = t0() + Duration::from_secs(5);
        let mut p = fenced();
        p.seal(t0());
        assert!(p.out.is_empty(), "nothing written, nothing to wait for");
        p.send(request(1, "a", far));
        p.send(request(2, "b", far));
        p.seal(t0());
        p.seal(t0());
        assert_eq!(
            written(&mut p),
            [cmd("EVAL", "a"), cmd("EVALSHA", "b"), cmd("WAIT", "500")]
        );
        let mut done = Vec::new();
        p.feed(&[ANSWER, ANSWER].concat());
        p.answers(&mut done, t0()).unwrap();
        assert!(done.is_empty(), "held until the replicas confirm");
        assert_eq!((p.in_flight(), p.unsettled()), (2, 2));
        // A WAIT is out (it blocks the connection on the server): c waits for the next one.
        p.send(request(3, "c", far));
        p.seal(t0());
        assert_eq!(written(&mut p), [cmd("EVALSHA", "c")]);
        // The first WAIT: one replica has a and b. Then c, held for a WAIT of its own.
        p.feed(&[b":1\r\n".as_slice(), ANSWER].concat());
        p.answers(&mut done, t0()).unwrap();
        let ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        assert_eq!(ids, [1, 2]);
        assert_eq!(done[0].result, Ok(Answer::new(&[1, 60_000])));
        p.seal(t0());
        assert_eq!(written(&mut p), [cmd("WAIT", "500")]);
        // Too few replicas for c.
        p.feed(b":0\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(
            done[2].result,
            Err(Error::Unconfirmed {
                acked: 0,
                wanted: 1,
                ms: 500
            })
        );
        assert_eq!(done[2].result.as_ref().unwrap_err().sent(), Some(true));
        assert_eq!((p.in_flight(), p.unsettled()), (0, 0));
        assert_eq!(p.tally.unconfirmed, 1);
    }

    fn routed(id: u64, key: &str, deadline: Instant, route: Route) -> Request {
        let op = match route {
            Route::Slots => Op::Ping,
            _ => Op::Hit,
        };
        Request {
            route,
            op,
            ..request(id, key, deadline)
        }
    }

    #[test]
    fn an_asked_call_goes_after_asking_and_moved_settles_a_call_as_a_redirection() {
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(routed(1, "a", far, Route::Asking));
        p.send(request(2, "b", far));
        assert_eq!(
            written(&mut p),
            [cmd("ASKING", ""), cmd("EVAL", "a"), cmd("EVALSHA", "b")]
        );
        let mut done = Vec::new();
        // ASKING's OK comes first and answers no call.
        p.feed(b"+OK\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert!(done.is_empty());
        p.feed(&[ANSWER, b"-MOVED 3999 127.0.0.1:7001\r\n"].concat());
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done[0].result, Ok(Answer::new(&[1, 60_000])));
        let moved = Error::Redirected {
            slot: "3999".into(),
            to: "127.0.0.1:7001".into(),
            asking: false,
        };
        assert_eq!((done[1].id, &done[1].result), (2, &Err(moved.clone())));
        assert_eq!((moved.code(), moved.sent()), ("ERR_REDIS", None));
        assert!(moved.to_string().ends_with("MOVED 3999 127.0.0.1:7001"));
        assert_eq!((p.in_flight(), p.unsettled()), (0, 0));
        assert_eq!(p.tally.latency.count(), 1, "only the call that ran");
    }

    #[test]
    fn behind_a_fence_an_ask_settles_at_once_as_the_call_did_not_run() {
        let far = t0() + Duration::from_secs(5);
        let mut p = fenced();
        p.send(request(1, "a", far));
        p.seal(t0());
        assert_eq!(written(&mut p), [cmd("EVAL", "a"), cmd("WAIT", "500")]);
        let mut done = Vec::new();
        p.feed(b"-ASK 12 10.0.0.2:7002\r\n");
        p.answers(&mut done, t0()).unwrap();
        let ask = Error::Redirected {
            slot: "12".into(),
            to: "10.0.0.2:7002".into(),
            asking: true,
        };
        assert_eq!(done[0].result, Err(ask));
        assert_eq!(p.unsettled(), 0);
        p.feed(b":1\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.len(), 1, "the WAIT covers nothing more");
        // A malformed redirection is an error reply like any other.
        assert_eq!(redirection("MOVED", "3999"), None);
        assert_eq!(redirection("ERR", "MOVED 1 h:1"), None);
    }

    #[test]
    fn the_slot_map_reply_is_kept_whole_and_a_late_one_is_dropped() {
        let now = t0();
        let mut p = pipe();
        p.send(routed(7, "", now + Duration::from_secs(5), Route::Slots));
        assert_eq!(written(&mut p), [cmd("CLUSTER", "")]);
        let mut done = Vec::new();
        p.feed(b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n");
        let health = p.answers(&mut done, t0()).unwrap();
        assert!(health.answered && done.is_empty());
        let (id, reply) = p.replies.pop().unwrap();
        assert_eq!(id, 7);
        let Value::Array(Some(ranges)) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(ranges.len(), 1);
        assert_eq!(p.unsettled(), 0);
        // One that times out rejects, sent; its reply, when it comes, is dropped.
        p.send(routed(8, "", now + Duration::from_millis(10), Route::Slots));
        written(&mut p);
        p.expire(now + Duration::from_millis(10), &mut done);
        assert_eq!(
            done[0].result,
            Err(Error::Timeout {
                ms: 2_000,
                sent: true
            })
        );
        p.feed(b"*0\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert!(p.replies.is_empty());
        assert_eq!((p.in_flight(), p.unsettled()), (0, 0));
    }

    #[test]
    fn a_wait_answers_before_the_deadlines_of_the_calls_it_covers() {
        let now = t0();
        let mut p = fenced();
        p.send(request(1, "a", now + Duration::from_secs(5)));
        p.send(request(2, "b", now + Duration::from_millis(400)));
        p.seal(t0());
        let wait = written(&mut p).pop().unwrap();
        let ms: u64 = wait.1.parse().unwrap();
        assert_eq!(wait.0, "WAIT");
        assert!(
            (220..=240).contains(&ms),
            "{ms} ms: within b's 400 ms, less the margins"
        );
    }

    #[test]
    fn behind_a_fence_errors_go_at_once_and_retries_wait_for_their_own_wait() {
        let far = t0() + Duration::from_secs(5);
        let mut p = fenced();
        p.send(request(1, "a", far));
        p.seal(t0());
        let mut done = Vec::new();
        p.feed(ANSWER);
        p.feed(b":1\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.len(), 1);
        written(&mut p);
        // b meets NOSCRIPT, c a script error; the WAIT's reply comes after both.
        p.send(request(2, "b", far));
        p.send(request(3, "c", far));
        p.seal(t0());
        assert_eq!(
            written(&mut p),
            [cmd("EVALSHA", "b"), cmd("EVALSHA", "c"), cmd("WAIT", "500")]
        );
        p.feed(b"-NOSCRIPT No matching script\r\n-NOTCOUNTER not a counter\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.len(), 2, "the script error is not held");
        assert_eq!(done[1].id, 3);
        // b goes again; its WAIT waits for the one out.
        p.seal(t0());
        assert_eq!(written(&mut p), [cmd("EVAL", "b")]);
        // The first WAIT answers (it held nothing), then b's retry, then its own WAIT.
        p.feed(&[b":1\r\n".as_slice(), ANSWER].concat());
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.len(), 2, "b waits for the WAIT after its retry");
        p.seal(t0());
        assert_eq!(written(&mut p), [cmd("WAIT", "500")]);
        p.feed(b":1\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done[2].id, 2);
        assert_eq!(done[2].result, Ok(Answer::new(&[1, 60_000])));
    }

    #[test]
    fn a_held_answer_times_out_and_a_refused_wait_rejects_sent_and_tells_a_demotion() {
        let soon = t0() + Duration::from_millis(100);
        let mut p = fenced();
        p.send(request(1, "a", soon));
        p.send(request(2, "b", soon + Duration::from_secs(5)));
        p.seal(t0());
        let mut done = Vec::new();
        p.feed(&[ANSWER, ANSWER].concat());
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(p.next_deadline(), Some(soon));
        p.expire(soon, &mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(
            done[0].result,
            Err(Error::Timeout {
                ms: 2_000,
                sent: true
            })
        );
        // A demoted master refuses WAIT: the call ran there; the connection is to be replaced.
        p.feed(b"-ERR WAIT cannot be used with replica instances\r\n");
        let health = p.answers(&mut done, t0()).unwrap();
        assert!(health.unusable);
        assert_eq!(done.len(), 2);
        assert_eq!(done[1].id, 2);
        let error = done[1].result.as_ref().unwrap_err();
        assert_eq!((error.code(), error.sent()), ("ERR_REDIS", Some(true)));
        assert!(error.to_string().contains("refused the WAIT"), "{error}");
        assert_eq!(p.unsettled(), 0);
    }

    #[test]
    fn a_noscript_retry_times_out_by_its_own_deadline_behind_newer_held_answers() {
        let now = t0();
        let mut p = fenced();
        p.send(request(1, "a", now + Duration::from_secs(5)));
        p.seal(t0());
        let mut done = Vec::new();
        p.feed(&[ANSWER, b":1\r\n".as_slice()].concat());
        p.answers(&mut done, t0()).unwrap();
        written(&mut p);
        // The cache is flushed: b meets NOSCRIPT and waits for c, which is answered and held.
        p.send(request(2, "b", now + Duration::from_millis(100)));
        p.send(request(3, "c", now + Duration::from_secs(5)));
        p.seal(t0());
        written(&mut p);
        p.feed(&[b"-NOSCRIPT No matching script\r\n".as_slice(), ANSWER].concat());
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(written(&mut p), [cmd("EVAL", "b")]);
        assert_eq!(p.next_deadline(), Some(now + Duration::from_millis(100)));
        p.expire(now + Duration::from_millis(100), &mut done);
        assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_script_goes_as_eval_on_its_first_use_then_as_evalsha() {
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", far));
        p.send(request(2, "b", far));
        assert_eq!(written(&mut p), [cmd("EVAL", "a"), cmd("EVALSHA", "b")]);
        let mut done = Vec::new();
        p.feed(b"*2\r\n:1\r\n:60000\r\n*2\r\n:1\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn after_noscript_the_retries_go_in_order_ahead_of_later_hits() {
        let far = t0() + Duration::from_secs(5);
        let (mut p, mut done) = warmed(far);
        // The cache is flushed: both meet NOSCRIPT.
        p.send(request(2, "b", far));
        p.send(request(3, "c", far));
        assert_eq!(written(&mut p), [cmd("EVALSHA", "b"), cmd("EVALSHA", "c")]);
        p.feed(b"-NOSCRIPT No matching script\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert!(p.out.is_empty(), "nothing goes until c has answered");
        p.send(request(4, "b", far));
        assert!(p.out.is_empty(), "a later hit waits behind the retries");
        assert_eq!((p.in_flight(), p.unsettled()), (3, 3));
        p.feed(b"-NOSCRIPT No matching script\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(
            written(&mut p),
            [cmd("EVAL", "b"), cmd("EVAL", "c"), cmd("EVALSHA", "b")]
        );
        assert_eq!(p.tally.noscript, 2);
        // A NOSCRIPT to an EVAL is an error, not another retry.
        p.feed(b"-NOSCRIPT again\r\n*2\r\n:1\r\n:60000\r\n*2\r\n:2\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert!(p.out.is_empty());
        assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(done[1].result.as_ref().unwrap_err().code(), "ERR_REDIS");
        assert_eq!((p.in_flight(), p.unsettled()), (0, 0));
    }

    #[test]
    fn a_retry_overtaken_by_a_later_hit_on_its_key_rejects_unsent() {
        let far = t0() + Duration::from_secs(5);
        let (mut p, mut done) = warmed(far);
        // Flushed; another client loads the script between 2 and 3 (both on
        // "a"): 2 meets NOSCRIPT, 3 runs. 4 on "b" met NOSCRIPT too.
        p.send(request(2, "a", far));
        p.send(request(4, "b", far));
        p.send(request(3, "a", far));
        written(&mut p);
        p.feed(b"-NOSCRIPT No matching script\r\n-NOSCRIPT No matching script\r\n*2\r\n:2\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        let ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(done[1].result, Err(Error::Overtaken));
        assert_eq!(done[1].result.as_ref().unwrap_err().sent(), Some(false));
        // Only the hit on "b" goes again.
        assert_eq!(written(&mut p), [cmd("EVAL", "b")]);
        assert_eq!(p.tally.noscript, 1);
        assert_eq!((p.in_flight(), p.unsettled()), (1, 1));
    }

    #[test]
    fn timed_out_hits_reject_once_and_their_late_replies_are_dropped() {
        let start = t0() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", start));
        p.send(request(2, "b", start + Duration::from_secs(10)));
        let mut done = Vec::new();
        assert!(
            p.expire(start, &mut done),
            "nothing answered since it was sent"
        );
        assert_eq!((p.in_flight(), p.unsettled()), (2, 1));
        assert_eq!(
            done[0].result,
            Err(Error::Timeout {
                ms: 2_000,
                sent: true
            })
        );
        assert_eq!(p.next_deadline(), Some(start + Duration::from_secs(10)));
        p.feed(b"*2\r\n:1\r\n:5\r\n*2\r\n:7\r\n:5\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(done[1].id, 2);
        assert_eq!(done[1].result, Ok(Answer::new(&[7, 5])));
    }

    #[test]
    fn a_first_use_waits_for_the_evalshas_written_before_it() {
        // After a SCRIPT FLUSH, a consume goes as EVALSHA (its script was
        // loaded) and a hit on the same key as EVAL (its script's first use):
        // written together, the hit would run before the consume's retry.
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        let mut done = Vec::new();
        let consume = |id| {
            let mut r = request(id, "a", far);
            r.op = Op::Consume;
            r.args = [5, 60_000, 1, 0];
            r
        };
        p.send(consume(1));
        p.feed(b"*5\r\n:1\r\n:1\r\n:4\r\n:60000\r\n:1\r\n");
        p.answers(&mut done, t0()).unwrap();
        written(&mut p);
        p.send(consume(2));
        p.send(request(3, "a", far));
        assert_eq!(written(&mut p), [cmd("EVALSHA", "a")], "the hit waits");
        p.feed(b"-NOSCRIPT No matching script\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(written(&mut p), [cmd("EVAL", "a"), cmd("EVAL", "a")]);
        p.feed(b"*5\r\n:1\r\n:1\r\n:4\r\n:60000\r\n:1\r\n*2\r\n:4\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn an_unlink_waits_for_the_evalshas_written_before_it() {
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        let mut done = Vec::new();
        p.send(request(1, "a", far));
        p.feed(b"*2\r\n:1\r\n:60000\r\n");
        p.answers(&mut done, t0()).unwrap();
        written(&mut p);
        p.send(request(2, "a", far));
        let mut unlink = request(3, "a", far);
        unlink.op = Op::Unlink;
        p.send(unlink);
        p.send(request(4, "a", far));
        assert_eq!(written(&mut p), [cmd("EVALSHA", "a")]);
        p.feed(b"-NOSCRIPT No matching script\r\n");
        p.answers(&mut done, t0()).unwrap();
        assert_eq!(
            written(&mut p),
            [cmd("EVAL", "a"), cmd("UNLINK", ""), cmd("EVALSHA", "a")]
        );
    }

    #[test]
    fn a_connection_that_answers_meanwhile_is_stuck_after_three_timeouts_in_a_row() {
        let start = t0() + Duration::from_secs(5);
        let mut p = pipe();
        let mut done = Vec::new();
        // Each round: one hit answered in time after the others were sent.
        for (round, slow) in [(0u64, 2u64), (1, 3)] {
            let at = start + Duration::from_secs(round * 10);
            p.send(request(round * 10, "fast", at + Duration::from_secs(1)));
            for i in 1..=slow {
                p.send(request(round * 10 + i, "slow", at));
            }
            p.feed(b"*2\r\n:1\r\n:5\r\n");
            p.answers(&mut done, t0()).unwrap();
            let stuck = p.expire(at, &mut done);
            assert_eq!(stuck, slow >= 3, "{slow} timeouts in a row");
            for _ in 0..slow {
                p.feed(b"*2\r\n:1\r\n:5\r\n");
            }
            p.answers(&mut done, t0()).unwrap();
        }
    }

    #[test]
    fn readonly_marks_the_connection_unusable_and_errors_name_no_secret() {
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "203.0.113.9", far));
        let mut done = Vec::new();
        p.feed(b"-READONLY You can't write against a read only replica 203.0.113.9 hunter2\r\n");
        let health = p.answers(&mut done, t0()).unwrap();
        assert!(health.unusable);
        let text = done[0].result.as_ref().unwrap_err().to_string();
        assert!(
            !text.contains("203.0.113.9") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn a_lost_connection_rejects_what_is_in_flight() {
        let far = t0() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", far));
        p.send(request(2, "b", far));
        let mut done = Vec::new();
        p.fail(
            &Error::Connection {
                text: "lost".into(),
                sent: true,
            },
            &mut done,
        );
        assert_eq!(done.len(), 2);
        assert_eq!(p.in_flight(), 0);
        p.feed(b":1\r\n");
        assert_eq!(
            p.answers(&mut done, t0()),
            Err(Malformed),
            "a reply nothing asked for"
        );
    }
}
