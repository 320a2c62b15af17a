//! The order of a store's calls, and their batches.
//!
//! Every call joins one queue, in the order JavaScript made it. One batch
//! is on the connection at a time ([`FLUSHERS`]); while it is, the calls
//! made meanwhile wait in the queue, and the next batch takes all the
//! algorithm calls at its front ([`MAX_BATCH`] at most) and sends them as
//! one statement: `unnest` of their arguments, each row one call of its
//! algorithm's function, in one transaction (one commit for the batch, not
//! one per call). A call alone goes out as its own short statement, as do
//! `reset`, `ping` and `resetAll`, each in its place in the queue; so calls
//! on one key apply in the order they were made, and each still answers its
//! own result.
//!
//! **Lock order.** A batch's rows are locked in one order, the same in
//! every instance: by table, then by key (byte order), the calls of one key
//! in the order they were made. Two batches wait for each other's rows only
//! in that order, so they never deadlock. A deadlock with another client,
//! or a serialization failure, rolled the whole statement back: it is sent
//! again (up to 3 times).
//!
//! **A row another session holds.** Each statement on the calls' connection
//! waits at most [`PgStore::lock_ms`] (a quarter of `timeoutMs`) for a row
//! lock. A batch that waited longer was rolled back; its calls go again as
//! one statement per key, pipelined, each waiting at most [`PROBE_MS`]: the
//! keys still locked are *stalled*. A stalled key's calls (those of the
//! batch, and every later one until one succeeds) go on the second
//! connection, one key at a time, each statement waiting for the lock until
//! just before its first call's `timeoutMs`: then the call rejects
//! `ERR_TIMEOUT`, sent, counting nothing (PostgreSQL rolled it back). The
//! other keys go on on the first connection meanwhile.
//!
//! A batch's statement is atomic. When the database refuses it for one call's
//! data (a count past the safe-integer range, a key the database can't hold),
//! nothing of it was applied, and it goes again one statement per key; a
//! key's statement refused again goes call by call, in order, so only that
//! call fails. Any other failure (the connection lost, a timeout, a
//! read-only server, a cancelled statement) fails every call of the batch
//! with the same error and `sent` flag.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Failure, PgConn, PgStore};
use crate::errors::{Backend, Error, Result};
use crate::ops::{Answer, Args, Op};

/// Batches on the connection at once. One: a batch refused for one call's
/// data is sent again call by call before anything made after it is sent,
/// so calls keep their order.
const FLUSHERS: usize = 1;
/// Calls one batch takes at most.
pub const MAX_BATCH: usize = 512;
/// How long a key's statement waits for its row after its batch waited
/// [`PgStore::lock_ms`] in vain: a key still locked then is stalled.
pub const PROBE_MS: u64 = 50;

/// Stalled keys kept at most (past it the set starts over: a key still held
/// is found again by its next batch).
const MAX_STALLED: usize = 10_000;

/// What a call asks of the database.
pub enum Work {
    Call {
        op: Op,
        args: Args,
        key: String,
    },
    ResetAll,
    /// Several takes as one step: one transaction of its own, alone in its batch.
    Step(Arc<StepWork>),
}

/// A step's takes `(op, args, stored key)`, and, once it has run, their answers.
pub struct StepWork {
    pub takes: Vec<(Op, Args, String)>,
    pub answers: std::sync::Mutex<Option<Vec<Result<Answer>>>>,
}

/// A call waiting in the queue or in a batch.
struct Pending {
    id: u64,
    work: Work,
    /// Set once its batch is handed to the connection.
    sent: Arc<AtomicBool>,
    /// When its caller stops waiting.
    deadline: Instant,
    answer: oneshot::Sender<Result<Answer>>,
}

impl Pending {
    fn call(&self) -> Option<Encoded<'_>> {
        match &self.work {
            Work::Call { op, args, key } => Encoded::new(*op, args, key),
            Work::ResetAll | Work::Step(_) => None,
        }
    }

    /// The key whose row the call locks (none for `ping` and `resetAll`).
    fn key(&self) -> Option<&str> {
        match &self.work {
            Work::Call { op: Op::Ping, .. } | Work::ResetAll | Work::Step(_) => None,
            Work::Call { key, .. } => Some(key),
        }
    }
}

/// A call in the queue: what [`PgStore::wait`] waits on.
pub struct Queued {
    id: u64,
    sent: Arc<AtomicBool>,
    result: oneshot::Receiver<Result<Answer>>,
}

#[derive(Default)]
pub struct Queue {
    waiting: VecDeque<Pending>,
    /// Batches being sent or answered on the first connection.
    flushing: usize,
    /// Whether the second connection's flusher runs.
    side: bool,
    next_id: u64,
    /// The stalled keys: their calls go on the second connection.
    stalled: HashSet<String>,
}

/// What became of a call of a batch.
#[derive(Clone)]
enum BatchOutcome {
    Done(Result<Answer>),
    /// Its key's row is held elsewhere: nothing was applied; it goes on the second connection.
    Stalled,
}

/// Which algorithm's function a call runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Fixed = 0,
    Sliding = 1,
    Bucket = 2,
}

/// A call of an algorithm's function: the fixed window's and the sliding
/// window's take `(op, key, window_ms, amount, arg)`, the bucket's `(key,
/// capacity, refill, interval_ms, cost)`; `a..d` are the integers in order.
pub struct Encoded<'k> {
    pub kind: Kind,
    pub op: i32,
    pub key: &'k str,
    pub a: i64,
    pub b: i64,
    pub c: i64,
    pub d: i64,
    pub len: usize,
}

impl<'k> Encoded<'k> {
    pub fn new(op: Op, args: &Args, key: &'k str) -> Option<Encoded<'k>> {
        let (kind, code, a, b, c, d) = match op {
            // (op, windowMs, amount, arg): the consume's arg is its limit, the refund's the window it names.
            Op::Hit => (Kind::Fixed, 0, args[0], args[1], 0, 0),
            Op::Consume => (Kind::Fixed, 1, args[0], args[2], args[1], 0),
            Op::Refund => (Kind::Fixed, 2, 1, args[0], args[1], 0),
            // (op, windowMs, amount, arg): the decrement's arg is the window it names, the consume's its limit.
            Op::SlidingIncrement => (Kind::Sliding, 0, args[0], args[1], 0, 0),
            Op::SlidingDecrement => (Kind::Sliding, 1, args[0], args[1], args[2], 0),
            Op::SlidingConsume => (Kind::Sliding, 2, args[0], args[2], args[1], 0),
            // (capacity, refill, intervalMs, cost)
            Op::Bucket => (Kind::Bucket, 0, args[0], args[1], args[2], args[3]),
            Op::Unlink | Op::Ping | Op::Takes => return None,
        };
        Some(Encoded {
            kind,
            op: code,
            key,
            a,
            b,
            c,
            d,
            len: op.answer_len(),
        })
    }
}

/// `e` with the `sent` flag a timeout or a lost connection carries: whether
/// the call had been handed to the connection.
pub(super) fn with_sent(e: Error, sent: bool) -> Error {
    match e {
        // (A statement_timeout's error already says what happened to the call.)
        Error::Sql {
            store: Backend::Postgres,
            code,
            text,
            sent: None,
        } if code == "ERR_TIMEOUT" || code == "ERR_CONNECTION" => {
            let tail = if sent {
                "; the call was sent, is not sent again, and may or may not have counted"
            } else {
                " while connecting; the call was not sent"
            };
            Error::Sql {
                store: Backend::Postgres,
                code,
                text: format!("{text}{tail}"),
                sent: Some(sent),
            }
        }
        other => other,
    }
}

/// No answer within `timeoutMs`; [`with_sent`] adds what became of the call.
pub(super) fn timeout_error(ms: u64) -> Error {
    Error::Sql {
        store: Backend::Postgres,
        code: "ERR_TIMEOUT",
        text: format!("no answer from PostgreSQL within {ms} ms"),
        sent: None,
    }
}

/// Whether a failure is one call's data, so that each call is sent again on
/// its own: a count out of range, SQLSTATE class 22 (data exception: a key
/// with a character the database's encoding can't hold), or 21000 (two of
/// a batch's keys that the table's key column holds as one).
fn one_calls_fault(f: &Failure) -> bool {
    matches!(f.error, Error::CountOutOfRange)
        || f.state.as_deref().is_some_and(|state| {
            super::codes::data_exception(state) || state == super::codes::CARDINALITY_VIOLATION
        })
}

/// Whether a statement waited for a row lock past its lock_timeout (55P03).
fn locked(f: &Failure) -> bool {
    f.state.as_deref() == Some(super::codes::LOCK_NOT_AVAILABLE)
}

impl PgStore {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` and answers its result within the store's timeout.
    pub(super) async fn submit(self: &Arc<Self>, work: Work) -> Result<Answer> {
        let queued = self.enqueue(work);
        self.wait(queued).await
    }

    /// Queues `work` in its place, now, starting the flushers it needs
    /// (their own tasks: they run once the caller's task yields). Calls
    /// queued in one go are in the queue together before any is taken.
    pub(super) fn enqueue(self: &Arc<Self>, work: Work) -> Queued {
        let (answer, result) = oneshot::channel();
        let sent = Arc::new(AtomicBool::new(false));
        let ms = self.config.timeout_ms;
        let bound = Duration::from_millis(ms);
        let (id, start, side) = {
            let mut queue = self.queue();
            let id = queue.next_id;
            queue.next_id += 1;
            let pending = Pending {
                id,
                work,
                sent: Arc::clone(&sent),
                deadline: Instant::now() + bound,
                answer,
            };
            let side = !queue.side && pending.key().is_some_and(|k| queue.stalled.contains(k));
            queue.waiting.push_back(pending);
            let start = queue.flushing < FLUSHERS;
            if start {
                queue.flushing += 1;
            }
            if side {
                queue.side = true;
            }
            (id, start, side)
        };
        // Their own tasks: a caller that stops waiting never stops a batch of other calls.
        if start {
            let store = Arc::clone(self);
            tokio::spawn(async move { store.flush().await });
        }
        if side {
            let store = Arc::clone(self);
            tokio::spawn(async move { store.flush_side().await });
        }
        Queued { id, sent, result }
    }

    /// A queued call's answer within the store's timeout.
    pub async fn wait(self: &Arc<Self>, queued: Queued) -> Result<Answer> {
        let Queued { id, sent, result } = queued;
        let ms = self.config.timeout_ms;
        let bound = Duration::from_millis(ms);
        let outcome = tokio::time::timeout(bound, result).await;
        match outcome {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(with_sent(
                Error::Sql {
                    store: Backend::Postgres,
                    code: "ERR_CONNECTION",
                    text: "the store was closed before PostgreSQL answered".into(),
                    sent: None,
                },
                sent.load(Ordering::Relaxed),
            )),
            Err(_) => {
                // Still queued: it is taken out and never sent.
                let mut queue = self.queue();
                let queued = queue.waiting.iter().position(|p| p.id == id);
                if let Some(at) = queued {
                    queue.waiting.remove(at);
                }
                drop(queue);
                Err(with_sent(timeout_error(ms), sent.load(Ordering::Relaxed)))
            }
        }
    }

    /// Starts the flushers that have calls waiting for them and are not running.
    fn kick(self: &Arc<Self>) {
        let (main, side) = {
            let mut guard = self.queue();
            let queue = &mut *guard;
            let main = queue.flushing < FLUSHERS && !queue.waiting.is_empty();
            if main {
                queue.flushing += 1;
            }
            let side = !queue.side
                && queue
                    .waiting
                    .iter()
                    .any(|p| p.key().is_some_and(|k| queue.stalled.contains(k)));
            if side {
                queue.side = true;
            }
            (main, side)
        };
        if main {
            let store = Arc::clone(self);
            tokio::spawn(async move { store.flush().await });
        }
        if side {
            let store = Arc::clone(self);
            tokio::spawn(async move { store.flush_side().await });
        }
    }

    /// Sends batches while calls wait.
    async fn flush(self: Arc<Self>) {
        loop {
            let batch = {
                let mut queue = self.queue();
                let batch = take(&mut queue);
                if batch.is_empty() {
                    queue.flushing -= 1;
                    return;
                }
                batch
            };
            self.send(batch).await;
        }
    }

    /// Sends the stalled keys' calls on the second connection while they wait.
    async fn flush_side(self: Arc<Self>) {
        loop {
            let batch = {
                let mut queue = self.queue();
                let batch = take_stalled(&mut queue);
                if batch.is_empty() {
                    queue.side = false;
                    return;
                }
                batch
            };
            self.send_stalled(batch).await;
        }
    }

    /// Sends one batch on the connection (connecting first if need be) and
    /// answers each of its calls.
    async fn send(self: &Arc<Self>, mut batch: Vec<Pending>) {
        let ms = self.config.timeout_ms;
        let bound = Duration::from_millis(ms);
        let client = match tokio::time::timeout(bound, self.client(0)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return answer_all(batch, |_| Err(with_sent(e.clone(), false))),
            Err(_) => return answer_all(batch, |_| Err(with_sent(timeout_error(ms), false))),
        };
        // Calls whose callers stopped waiting meanwhile were told they were not sent: they are not.
        batch.retain(|p| !p.answer.is_closed());
        for p in &batch {
            p.sent.store(true, Ordering::Relaxed);
        }
        let work = self.execute(&client, &batch, self.lock_ms());
        let outcomes = match tokio::time::timeout(bound, work).await {
            Ok(outcomes) => {
                self.answered(true);
                outcomes
            }
            Err(_) => {
                self.answered(false);
                // Its backend stops waiting (on a lock, say), and the connection serves the next batch.
                self.cancel(&client);
                vec![BatchOutcome::Done(Err(timeout_error(ms))); batch.len()]
            }
        };
        let mut stalled = Vec::new();
        for (p, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                BatchOutcome::Done(result) => {
                    let _ = p.answer.send(result.map_err(|e| with_sent(e, true)));
                }
                BatchOutcome::Stalled if matches!(p.work, Work::Step(_)) => {
                    let store = Arc::clone(self);
                    tokio::spawn(async move { store.send_step_side(p).await });
                }
                BatchOutcome::Stalled => stalled.push(p),
            }
        }
        if !stalled.is_empty() {
            self.stall(stalled);
        }
    }

    /// Puts back calls whose key is stalled (nothing of them was applied) in
    /// their places in the queue, for the second connection.
    fn stall(self: &Arc<Self>, calls: Vec<Pending>) {
        {
            let mut guard = self.queue();
            let queue = &mut *guard;
            for p in calls {
                p.sent.store(false, Ordering::Relaxed);
                if let Some(key) = p.key() {
                    // Keys stay stalled until a call on them succeeds: the set is bounded all the same.
                    if queue.stalled.len() >= MAX_STALLED && !queue.stalled.contains(key) {
                        queue.stalled.clear();
                    }
                    queue.stalled.insert(key.to_string());
                }
                let at = queue.waiting.partition_point(|q| q.id < p.id);
                queue.waiting.insert(at, p);
            }
        }
        self.kick();
    }

    /// How long a statement on a held row may wait for it (its
    /// lock_timeout, in ms), for calls whose earliest deadline is
    /// `deadline`: up to that deadline, less a fifth of timeoutMs (at most
    /// 500 ms) for PostgreSQL's 55P03 to come back before the call's time is
    /// up, on a loaded machine too, so that the call is told it counted
    /// nothing rather than that it may have.
    fn lock_wait(&self, deadline: Instant) -> u64 {
        let margin = Duration::from_millis((self.config.timeout_ms / 5).clamp(1, 500));
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        (wait.as_millis() as u64).max(1)
    }

    /// Sends the calls of one stalled key on the second connection, its
    /// statement waiting for the row until just before the first call's
    /// time runs out; answers each call. Once they succeed, the key is no
    /// longer stalled.
    async fn send_stalled(self: &Arc<Self>, mut batch: Vec<Pending>) {
        let ms = self.config.timeout_ms;
        let bound = Duration::from_millis(ms);
        let key = batch[0].key().map(str::to_string).unwrap_or_default();
        let client = match tokio::time::timeout(bound, self.client(1)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return answer_all(batch, |_| Err(with_sent(e.clone(), false))),
            Err(_) => return answer_all(batch, |_| Err(with_sent(timeout_error(ms), false))),
        };
        batch.retain(|p| !p.answer.is_closed());
        let Some(first) = batch.iter().map(|p| p.deadline).min() else {
            return;
        };
        for p in &batch {
            p.sent.store(true, Ordering::Relaxed);
        }
        let lock = self.lock_wait(first);
        let work = self.execute_stalled(&client, &batch, lock);
        let (results, free) = match tokio::time::timeout(bound, work).await {
            Ok(done) => done,
            Err(_) => {
                self.cancel(&client);
                self.drop_client(1, &client).await;
                (vec![Err(timeout_error(ms)); batch.len()], false)
            }
        };
        for (p, result) in batch.into_iter().zip(results) {
            let _ = p.answer.send(result.map_err(|e| with_sent(e, true)));
        }
        if free {
            self.queue().stalled.remove(&key);
            self.kick();
        }
    }

    /// A step that met a row another session holds, again on the second
    /// connection (its own task: the first connection's calls go on), its
    /// statement waiting for the rows until just before its time runs out.
    async fn send_step_side(self: Arc<Self>, p: Pending) {
        let ms = self.config.timeout_ms;
        let left = p.deadline.saturating_duration_since(Instant::now());
        let client = match tokio::time::timeout(left, self.client(1)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let _ = p.answer.send(Err(with_sent(e, false)));
                return;
            }
            Err(_) => {
                let _ = p.answer.send(Err(with_sent(timeout_error(ms), false)));
                return;
            }
        };
        if p.answer.is_closed() {
            return;
        }
        let lock = self.lock_wait(p.deadline);
        p.sent.store(true, Ordering::Relaxed);
        let work = self.execute_other(&client, &p, lock);
        let result = match tokio::time::timeout(left, work).await {
            Ok(result) => result.map_err(|f| f.error),
            Err(_) => {
                self.cancel(&client);
                self.drop_client(1, &client).await;
                Err(timeout_error(ms))
            }
        };
        let _ = p.answer.send(result.map_err(|e| with_sent(e, true)));
    }

    /// The results of the calls of one key, and whether the key's row was free.
    async fn execute_stalled(
        &self,
        client: &PgConn,
        batch: &[Pending],
        lock_ms: u64,
    ) -> (Vec<Result<Answer>>, bool) {
        if let [one] = batch {
            if one.call().is_none() {
                return match self.execute_other(client, one, lock_ms).await {
                    Ok(answer) => (vec![Ok(answer)], true),
                    Err(f) => {
                        let free = !locked(&f);
                        (vec![Err(f.error)], free)
                    }
                };
            }
        }
        let calls: Vec<Encoded<'_>> = batch.iter().filter_map(Pending::call).collect();
        let refs: Vec<&Encoded<'_>> = calls.iter().collect();
        match self.run_calls(client, &refs, lock_ms).await {
            Ok(answers) => (answers, true),
            Err(f) if one_calls_fault(&f) => {
                let mut results = Vec::with_capacity(refs.len());
                let mut free = true;
                for call in &refs {
                    match self.run_calls(client, &[call], lock_ms).await {
                        Ok(mut one) => results.push(
                            one.pop()
                                .unwrap_or_else(|| Err(super::schema::wrong_shape())),
                        ),
                        Err(f) => {
                            free &= !locked(&f);
                            results.push(Err(f.error));
                        }
                    }
                }
                (results, free)
            }
            Err(f) => {
                let free = !locked(&f);
                (vec![Err(f.error); refs.len()], free)
            }
        }
    }

    /// The outcomes of `batch`'s calls, in order.
    async fn execute(&self, client: &PgConn, batch: &[Pending], lock_ms: u64) -> Vec<BatchOutcome> {
        if let [one] = batch {
            if one.call().is_none() {
                return vec![match self.execute_other(client, one, lock_ms).await {
                    Ok(answer) => BatchOutcome::Done(Ok(answer)),
                    Err(f) if locked(&f) && one.key().is_some() => BatchOutcome::Stalled,
                    // A step that met a row another session holds goes on the second connection.
                    Err(f) if locked(&f) && matches!(one.work, Work::Step(_)) => {
                        BatchOutcome::Stalled
                    }
                    Err(f) => BatchOutcome::Done(Err(f.error)),
                }];
            }
        }
        let calls: Vec<Encoded<'_>> = batch.iter().filter_map(Pending::call).collect();
        // The lock order: by table, then key; a key's calls in the order they were made (a stable sort).
        let mut order: Vec<usize> = (0..calls.len()).collect();
        order.sort_by(|&i, &j| {
            (calls[i].kind as u8, calls[i].key).cmp(&(calls[j].kind as u8, calls[j].key))
        });
        let sorted: Vec<&Encoded<'_>> = order.iter().map(|&i| &calls[i]).collect();
        let outcomes = match self.run_calls(client, &sorted, lock_ms).await {
            Ok(answers) => answers.into_iter().map(BatchOutcome::Done).collect(),
            Err(f) if locked(&f) || one_calls_fault(&f) => {
                self.by_key(client, &sorted, PROBE_MS.min(lock_ms)).await
            }
            Err(f) => vec![BatchOutcome::Done(Err(f.error)); sorted.len()],
        };
        let mut answered: Vec<Option<BatchOutcome>> = vec![None; calls.len()];
        for (outcome, &at) in outcomes.into_iter().zip(&order) {
            answered[at] = Some(outcome);
        }
        answered
            .into_iter()
            .map(|o| o.unwrap_or_else(|| BatchOutcome::Done(Err(super::schema::wrong_shape()))))
            .collect()
    }

    /// `sorted`'s calls again, one statement per key (pipelined, each
    /// waiting at most `lock_ms`); a key's statement refused for one call's
    /// data goes call by call, in order.
    async fn by_key(
        &self,
        client: &PgConn,
        sorted: &[&Encoded<'_>],
        lock_ms: u64,
    ) -> Vec<BatchOutcome> {
        let mut groups: Vec<&[&Encoded<'_>]> = Vec::new();
        let mut start = 0;
        for i in 1..=sorted.len() {
            let same = i < sorted.len()
                && sorted[i].kind == sorted[start].kind
                && sorted[i].key == sorted[start].key;
            if !same {
                groups.push(&sorted[start..i]);
                start = i;
            }
        }
        let runs = futures_util::future::join_all(
            groups
                .iter()
                .map(|group| self.run_calls(client, group, lock_ms)),
        )
        .await;
        let mut outcomes = Vec::with_capacity(sorted.len());
        for (group, run) in groups.iter().zip(runs) {
            match run {
                Ok(answers) => outcomes.extend(answers.into_iter().map(BatchOutcome::Done)),
                Err(f) if locked(&f) => {
                    outcomes.extend(group.iter().map(|_| BatchOutcome::Stalled))
                }
                Err(f) if one_calls_fault(&f) => {
                    let mut stalled = false;
                    for call in group.iter() {
                        if stalled {
                            outcomes.push(BatchOutcome::Stalled);
                            continue;
                        }
                        match self.run_calls(client, &[call], lock_ms).await {
                            Ok(mut one) => outcomes.push(BatchOutcome::Done(
                                one.pop()
                                    .unwrap_or_else(|| Err(super::schema::wrong_shape())),
                            )),
                            // The rest of the key's calls follow it, in order.
                            Err(f) if locked(&f) => {
                                stalled = true;
                                outcomes.push(BatchOutcome::Stalled);
                            }
                            Err(f) => outcomes.push(BatchOutcome::Done(Err(f.error))),
                        }
                    }
                }
                Err(f) => outcomes.extend(
                    group
                        .iter()
                        .map(|_| BatchOutcome::Done(Err(f.error.clone()))),
                ),
            }
        }
        outcomes
    }

    /// A call that is not an algorithm's: `reset`, `ping`, `resetAll`.
    async fn execute_other(
        &self,
        client: &PgConn,
        p: &Pending,
        lock_ms: u64,
    ) -> std::result::Result<Answer, Failure> {
        match &p.work {
            Work::Call { op, args, key } => self.run_op(client, *op, args, key, lock_ms).await,
            Work::ResetAll => self
                .reset_all_on(client, lock_ms)
                .await
                .map(|()| Answer::new(&[])),
            Work::Step(step) => self
                .run_step(client, step, lock_ms)
                .await
                .map(|()| Answer::new(&[])),
        }
    }
}

/// The next batch for the first connection: the front call alone if it is
/// not an algorithm's, else every algorithm call at the front (up to
/// [`MAX_BATCH`]). Calls of stalled keys are left for the second
/// connection, and calls whose callers stopped waiting are dropped on the way.
fn take(queue: &mut Queue) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut left = Vec::new();
    while let Some(front) = queue.waiting.pop_front() {
        if front.answer.is_closed() {
            continue;
        }
        if front.key().is_some_and(|k| queue.stalled.contains(k)) {
            left.push(front);
            continue;
        }
        let joins = front.call().is_some();
        if !batch.is_empty() && (!joins || batch.len() == MAX_BATCH) {
            queue.waiting.push_front(front);
            break;
        }
        batch.push(front);
        if !joins {
            break;
        }
    }
    for p in left.into_iter().rev() {
        queue.waiting.push_front(p);
    }
    batch
}

/// The next batch for the second connection: the calls of the first stalled
/// key waiting, in order (its algorithm calls at once, up to [`MAX_BATCH`];
/// any other call alone).
fn take_stalled(queue: &mut Queue) -> Vec<Pending> {
    queue.waiting.retain(|p| !p.answer.is_closed());
    let Some(at) = queue
        .waiting
        .iter()
        .position(|p| p.key().is_some_and(|k| queue.stalled.contains(k)))
    else {
        return Vec::new();
    };
    let key = queue.waiting[at].key().map(str::to_string);
    let mut batch = Vec::new();
    let mut i = at;
    while i < queue.waiting.len() {
        let p = &queue.waiting[i];
        if p.key().map(str::to_string) != key {
            i += 1;
            continue;
        }
        let joins = p.call().is_some();
        if !batch.is_empty() && (!joins || batch.len() == MAX_BATCH) {
            break;
        }
        batch.extend(queue.waiting.remove(i));
        if !joins {
            break;
        }
    }
    batch
}

fn answer_all(batch: Vec<Pending>, result: impl Fn(&Pending) -> Result<Answer>) {
    for p in batch {
        let r = result(&p);
        let _ = p.answer.send(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(id: u64, op: Op) -> (Pending, oneshot::Receiver<Result<Answer>>) {
        let (answer, rx) = oneshot::channel();
        let work = Work::Call {
            op,
            args: [60_000, 1, 0, 0],
            key: format!("k{id}"),
        };
        let sent = Arc::new(AtomicBool::new(false));
        (
            Pending {
                id,
                work,
                sent,
                deadline: Instant::now(),
                answer,
            },
            rx,
        )
    }

    #[test]
    fn a_batch_takes_the_algorithm_calls_at_the_front_and_stops_at_any_other_call() {
        let mut queue = Queue::default();
        let mut kept = Vec::new();
        for (id, op) in [
            Op::Hit,
            Op::SlidingIncrement,
            Op::Unlink,
            Op::Unlink,
            Op::Bucket,
        ]
        .into_iter()
        .enumerate()
        {
            let (p, rx) = pending(id as u64, op);
            queue.waiting.push_back(p);
            kept.push(rx);
        }
        let ids = |batch: Vec<Pending>| batch.iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(take(&mut queue)), [0, 1]);
        assert_eq!(ids(take(&mut queue)), [2]);
        assert_eq!(ids(take(&mut queue)), [3]);
        assert_eq!(ids(take(&mut queue)), [4]);
        assert!(take(&mut queue).is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_calls_and_skips_calls_nobody_waits_for() {
        let mut queue = Queue::default();
        let mut kept = Vec::new();
        for id in 0..(MAX_BATCH as u64 + 3) {
            let (p, rx) = pending(id, Op::Hit);
            queue.waiting.push_back(p);
            // The caller of call 1 stopped waiting.
            if id != 1 {
                kept.push(rx);
            }
        }
        let first = take(&mut queue);
        assert_eq!(first.len(), MAX_BATCH);
        assert!(first.iter().all(|p| p.id != 1));
        assert_eq!(take(&mut queue).len(), 2);
    }

    #[test]
    fn a_stalled_key_s_calls_are_left_for_the_second_connection_in_their_order() {
        let mut queue = Queue::default();
        let mut kept = Vec::new();
        for id in 0..6u64 {
            let (mut p, rx) = pending(id, Op::Hit);
            if let Work::Call { key, .. } = &mut p.work {
                *key = if id % 2 == 0 {
                    "x".into()
                } else {
                    format!("k{id}")
                };
            }
            queue.waiting.push_back(p);
            kept.push(rx);
        }
        queue.stalled.insert("x".into());
        let ids = |batch: Vec<Pending>| batch.iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(take(&mut queue)), [1, 3, 5]);
        assert_eq!(ids(take_stalled(&mut queue)), [0, 2, 4]);
        assert!(take(&mut queue).is_empty());
        assert!(take_stalled(&mut queue).is_empty());
    }
}
