//! The order of a store's calls, and their batches.
//!
//! Every call joins one queue, in the order JavaScript made it. One batch
//! is on the connection at a time ([`FLUSHERS`]); while it is, the calls
//! made meanwhile wait in the queue, and the next batch takes all the
//! algorithm calls at its front ([`MAX_BATCH`] at most) and sends them as
//! one statement: `unnest` of their arguments, each row one call of its
//! algorithm's function, applied in the order of the rows, in one
//! transaction (one commit for the batch, not one per call). A call alone
//! goes out as its own short statement, as do `reset`, `ping` and
//! `resetAll`, each in its place in the queue; so calls on one key apply in
//! the order they were made, and each still answers its own result.
//!
//! A batch's statement is atomic. When the database refuses it for one call's
//! data (a count past the safe-integer range, a key the database can't hold),
//! nothing of it was applied, and each call is sent again on its own, in
//! order, so only that call fails. Any other failure (the connection lost, a
//! timeout, a read-only server, a cancelled statement) fails every call of
//! the batch with the same error and `sent` flag.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use super::{schema, PgStore};
use crate::errors::{Error, Result};
use crate::ops::{Answer, Args, Op};

/// Batches on the connection at once. One: a batch refused for one call's
/// data is sent again call by call before anything made after it is sent,
/// so calls keep their order (and two measured no faster: the commits of
/// one connection are one after another either way).
const FLUSHERS: usize = 1;
/// Calls one batch takes at most.
pub const MAX_BATCH: usize = 512;

/// What a call asks of the database.
pub enum Work {
    Call { op: Op, args: Args, key: String },
    ResetAll,
}

/// A call waiting in the queue or in a batch.
struct Pending {
    id: u64,
    work: Work,
    /// Set once its batch is handed to the connection.
    sent: Arc<AtomicBool>,
    answer: oneshot::Sender<Result<Answer>>,
}

impl Pending {
    fn call(&self) -> Option<Encoded<'_>> {
        match &self.work {
            Work::Call { op, args, key } => Encoded::new(*op, args, key),
            Work::ResetAll => None,
        }
    }
}

#[derive(Default)]
pub struct Queue {
    waiting: VecDeque<Pending>,
    /// Batches being sent or answered.
    flushing: usize,
    next_id: u64,
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
            Op::Unlink | Op::Ping => return None,
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
        Error::Postgres {
            code,
            text,
            sent: None,
        } if code == "ERR_TIMEOUT" || code == "ERR_CONNECTION" => {
            let tail = if sent {
                "; the call was sent, is not sent again, and may or may not have counted"
            } else {
                " while connecting; the call was not sent"
            };
            Error::Postgres {
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
    Error::Postgres {
        code: "ERR_TIMEOUT",
        text: format!("no answer from PostgreSQL within {ms} ms"),
        sent: None,
    }
}

/// Whether a batch's failure is one call's data, so that each call is sent
/// again on its own: a count out of range, or SQLSTATE class 22 (data
/// exception: a key with a character the database's encoding can't hold).
fn one_calls_fault(e: &Error, state: Option<&str>) -> bool {
    matches!(e, Error::CountOutOfRange) || state.is_some_and(|s| s.starts_with("22"))
}

impl PgStore {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` and answers its result within the store's timeout.
    pub(super) async fn submit(self: &Arc<Self>, work: Work) -> Result<Answer> {
        let (answer, result) = oneshot::channel();
        let sent = Arc::new(AtomicBool::new(false));
        let (id, start) = {
            let mut queue = self.queue();
            let id = queue.next_id;
            queue.next_id += 1;
            queue.waiting.push_back(Pending {
                id,
                work,
                sent: Arc::clone(&sent),
                answer,
            });
            let start = queue.flushing < FLUSHERS;
            if start {
                queue.flushing += 1;
            }
            (id, start)
        };
        if start {
            // Its own task: a caller that stops waiting never stops a batch of other calls.
            let store = Arc::clone(self);
            tokio::spawn(async move { store.flush().await });
        }
        let ms = self.config.timeout_ms;
        let outcome = tokio::time::timeout(Duration::from_millis(ms), result).await;
        match outcome {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(with_sent(
                Error::Postgres {
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

    /// Sends batches while calls wait.
    async fn flush(self: Arc<Self>) {
        loop {
            let batch = {
                let mut queue = self.queue();
                let batch = take(&mut queue.waiting);
                if batch.is_empty() {
                    queue.flushing -= 1;
                    return;
                }
                batch
            };
            self.send(batch).await;
        }
    }

    /// Sends one batch on the connection (connecting first if need be) and
    /// answers each of its calls.
    async fn send(&self, mut batch: Vec<Pending>) {
        let ms = self.config.timeout_ms;
        let bound = Duration::from_millis(ms);
        let client = match tokio::time::timeout(bound, self.client()).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return answer_all(batch, |_| Err(with_sent(e.clone(), false))),
            Err(_) => return answer_all(batch, |_| Err(with_sent(timeout_error(ms), false))),
        };
        // Calls whose callers stopped waiting meanwhile were told they were not sent: they are not.
        batch.retain(|p| !p.answer.is_closed());
        for p in &batch {
            p.sent.store(true, Ordering::Relaxed);
        }
        let results = match tokio::time::timeout(bound, self.execute(&client, &batch)).await {
            Ok(results) => {
                self.answered(true);
                results
            }
            Err(_) => {
                self.answered(false);
                vec![Err(timeout_error(ms)); batch.len()]
            }
        };
        for (p, result) in batch.into_iter().zip(results) {
            let _ = p.answer.send(result.map_err(|e| with_sent(e, true)));
        }
    }

    /// The results of `batch`'s calls, in order.
    async fn execute(&self, client: &Client, batch: &[Pending]) -> Vec<Result<Answer>> {
        if let [one] = batch {
            return vec![self.execute_one(client, one).await];
        }
        let calls: Vec<Encoded<'_>> = batch.iter().filter_map(Pending::call).collect();
        match self.execute_batch(client, &calls).await {
            Ok(answers) => answers,
            Err((e, state)) if one_calls_fault(&e, state.as_deref()) => {
                // Nothing of the batch was applied: each call again, alone, in order.
                let mut results = Vec::with_capacity(batch.len());
                for p in batch {
                    results.push(self.execute_one(client, p).await);
                }
                results
            }
            Err((e, _)) => vec![Err(e); batch.len()],
        }
    }

    async fn execute_one(&self, client: &Client, p: &Pending) -> Result<Answer> {
        match &p.work {
            Work::Call { op, args, key } => self.run_op(client, *op, args, key).await,
            Work::ResetAll => self.reset_all_on(client).await.map(|()| Answer::new(&[])),
        }
    }

    /// One statement for every call of `calls`: their answers, or the error
    /// (with its SQLSTATE) that refused them all.
    async fn execute_batch(
        &self,
        client: &Client,
        calls: &[Encoded<'_>],
    ) -> std::result::Result<Vec<Result<Answer>>, (Error, Option<String>)> {
        let mut kinds = 0;
        let (mut f, mut o, mut k) = (Vec::new(), Vec::new(), Vec::new());
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for call in calls {
            kinds |= 1 << call.kind as usize;
            f.push(call.kind as i32);
            o.push(call.op);
            k.push(call.key);
            a.push(call.a);
            b.push(call.b);
            c.push(call.c);
            d.push(call.d);
        }
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (&f, Type::INT4_ARRAY),
            (&o, Type::INT4_ARRAY),
            (&k, Type::TEXT_ARRAY),
            (&a, Type::INT8_ARRAY),
            (&b, Type::INT8_ARRAY),
            (&c, Type::INT8_ARRAY),
            (&d, Type::INT8_ARRAY),
        ];
        let rows = match client.query_typed(&self.sql.batch[kinds], &params).await {
            Ok(rows) => rows,
            Err(e) => {
                let state = e.as_db_error().map(|db| db.code().code().to_string());
                return Err((self.error(e), state));
            }
        };
        if rows.len() != calls.len() {
            return Err((schema::wrong_shape(), None));
        }
        Ok(rows
            .iter()
            .zip(calls)
            .map(|(row, call)| {
                let values: Option<Vec<i64>> = row.try_get(0).ok();
                super::answer(values, call.len)
            })
            .collect())
    }
}

/// The next batch: the front call alone if it is not an algorithm's, else
/// every algorithm call at the front (up to [`MAX_BATCH`]). Calls whose
/// callers stopped waiting are dropped on the way.
fn take(waiting: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut batch = Vec::new();
    while let Some(front) = waiting.front() {
        if front.answer.is_closed() {
            waiting.pop_front();
            continue;
        }
        let joins = front.call().is_some();
        if !batch.is_empty() && (!joins || batch.len() == MAX_BATCH) {
            break;
        }
        batch.extend(waiting.pop_front());
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
                answer,
            },
            rx,
        )
    }

    #[test]
    fn a_batch_takes_the_algorithm_calls_at_the_front_and_stops_at_any_other_call() {
        let mut waiting = VecDeque::new();
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
            waiting.push_back(p);
            kept.push(rx);
        }
        let ids = |batch: Vec<Pending>| batch.iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(take(&mut waiting)), [0, 1]);
        assert_eq!(ids(take(&mut waiting)), [2]);
        assert_eq!(ids(take(&mut waiting)), [3]);
        assert_eq!(ids(take(&mut waiting)), [4]);
        assert!(take(&mut waiting).is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_calls_and_skips_calls_nobody_waits_for() {
        let mut waiting = VecDeque::new();
        let mut kept = Vec::new();
        for id in 0..(MAX_BATCH as u64 + 3) {
            let (p, rx) = pending(id, Op::Hit);
            waiting.push_back(p);
            // The caller of call 1 stopped waiting.
            if id != 1 {
                kept.push(rx);
            }
        }
        let first = take(&mut waiting);
        assert_eq!(first.len(), MAX_BATCH);
        assert!(first.iter().all(|p| p.id != 1));
        assert_eq!(take(&mut waiting).len(), 2);
    }
}
