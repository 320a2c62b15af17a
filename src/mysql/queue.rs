//! The order of a store's calls, and their batches.
//!
//! Every call joins one queue, in the order JavaScript made it. Up to
//! `connections` batches are on their way at once, each on a connection of
//! its own. A batch takes the calls of the queue whose key has no call on
//! its way in another batch (up to [`MAX_BATCH`]), and sends them as one
//! query, each call its own statement (and its own transaction); so the
//! calls on one key apply in the order they were made, one batch at a time,
//! and a key held by another session holds back only the batch that has
//! it. `resetAll()` goes alone, once no batch is on its way, and the calls
//! made after it wait until it has answered: while it is on its way no
//! other batch is taken (another connection would otherwise run them
//! before its DELETEs, and they would count in a table it then empties).
//!
//! A statement that fails stops the query: that call gets the error, and the
//! calls after it in the batch, which did not run, go back to the front of
//! the queue, in order, to be sent again (they never ran, so nothing
//! counts twice). A lost connection or a batch with no answer within
//! `timeoutMs` fails every unanswered call of it, `sent: true`, and the
//! server's session of that connection is ended (`KILL`), so that nothing of
//! it keeps waiting there.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::proto::{MyFailure, StatementResult};
use super::step::MyStepWork;
use super::{codes, schema, timeout_error, with_sent, MyStore};
use crate::errors::{Backend, Error, Result};
use crate::ops::{Answer, Args, Op};
use crate::window::MAX_SAFE;

/// Calls one batch takes at most.
pub const MAX_BATCH: usize = 256;

/// What a call asks of the database.
pub enum MyWork {
    Call {
        op: Op,
        args: Args,
        key: String,
    },
    ResetAll,
    /// Several takes as one step: one transaction of its own, alone in its batch.
    Step(Arc<MyStepWork>),
}

struct MyPending {
    id: u64,
    work: MyWork,
    /// The key's row key, which orders the calls (None: ping, resetAll).
    row: Option<Vec<u8>>,
    /// Set while its batch is on its way.
    sent: Arc<AtomicBool>,
    /// Sent as a call of its own, never folded into another's (after a folded sum left the safe range).
    solo: bool,
    answer: oneshot::Sender<Result<Answer>>,
}

pub struct MyQueue {
    waiting: VecDeque<MyPending>,
    /// Keys with a call in a batch on its way, and how many.
    busy: HashMap<Vec<u8>, usize>,
    /// Batches on their way.
    flushing: usize,
    /// A resetAll is on its way: nothing else is taken until it answers.
    alone: bool,
    /// The connections no batch uses.
    free: Vec<usize>,
    next_id: u64,
}

impl MyPending {
    /// The row keys the call holds while its batch is on its way.
    fn rows(&self) -> Vec<Vec<u8>> {
        match &self.work {
            MyWork::Step(step) => step.takes.iter().map(|t| t.2.clone()).collect(),
            _ => self.row.iter().cloned().collect(),
        }
    }
}

impl MyQueue {
    pub fn new(connections: usize) -> MyQueue {
        MyQueue {
            waiting: VecDeque::new(),
            busy: HashMap::new(),
            flushing: 0,
            alone: false,
            free: (0..connections).rev().collect(),
            next_id: 0,
        }
    }

    /// The next batch: every call whose key is not on its way elsewhere, in
    /// order, up to [`MAX_BATCH`]; a resetAll alone, once nothing else is on
    /// its way (nothing after it is taken before it).
    fn take(&mut self) -> Vec<MyPending> {
        let mut batch = Vec::new();
        if self.alone {
            return batch;
        }
        let mut at = 0;
        while at < self.waiting.len() && batch.len() < MAX_BATCH {
            let p = &self.waiting[at];
            if p.answer.is_closed() {
                self.waiting.remove(at);
                continue;
            }
            if let MyWork::ResetAll = p.work {
                if at == 0 && batch.is_empty() && self.flushing == 0 {
                    batch.extend(self.waiting.pop_front());
                    self.alone = true;
                }
                break;
            }
            if let MyWork::Step(step) = &p.work {
                // Alone, once none of its keys is on its way; nothing after it is taken before it.
                let held = step.takes.iter().any(|t| self.busy.contains_key(&t.2));
                if batch.is_empty() && !held {
                    batch.extend(self.waiting.remove(at));
                }
                break;
            }
            let held = p
                .row
                .as_ref()
                .is_some_and(|row| self.busy.contains_key(row));
            if held {
                at += 1;
                continue;
            }
            batch.extend(self.waiting.remove(at));
        }
        for p in &batch {
            for row in p.rows() {
                *self.busy.entry(row).or_insert(0) += 1;
            }
        }
        batch
    }

    /// A batch has answered: its keys are free, and so is the queue after a resetAll.
    fn release(&mut self, rows: &[Vec<u8>]) {
        self.alone = false;
        for row in rows {
            if let Some(n) = self.busy.get_mut(row) {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(row);
                }
            }
        }
    }
}

/// Keys a batch of hits needs to go as one upsert: fewer go as calls.
const UPSERT_AT: usize = 2;

/// The server's clock in µs since the epoch, as the procedures read it.
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// What became of a batch sent as one upsert.
enum Upsert {
    /// Each call's answer, in the batch's order.
    Answered(Vec<Answer>),
    /// A statement failed and the transaction was rolled back: nothing
    /// changed, and the batch goes as calls.
    Calls,
    /// The connection failed, or gave no answer in time (`kill`: its
    /// session is to be ended): what ran is not known.
    Failed { error: Error, kill: bool },
}

/// Whether a batch goes as one upsert of its keys: hits on [`UPSERT_AT`]
/// keys or more (one key's hits go as one call of their sum, cheaper than
/// a transaction of its own), every one a fixed-window hit of a positive
/// amount (never one sent alone after a sum left the safe range), and no
/// key's sum past the safe range.
fn upsert_fits(batch: &[MyPending]) -> bool {
    if batch.len() < UPSERT_AT {
        return false;
    }
    let mut sums: HashMap<&[u8], i64> = HashMap::new();
    let hits = batch.iter().all(|p| match (&p.work, p.row.as_deref()) {
        (
            MyWork::Call {
                op: Op::Hit, args, ..
            },
            Some(row),
        ) if args[1] > 0 && !p.solo => {
            let sum = sums.entry(row).or_insert(0);
            *sum += args[1];
            *sum <= MAX_SAFE
        }
        _ => false,
    });
    hits && sums.len() >= UPSERT_AT
}

/// The batch's hits as one transaction: the rows that exist locked in key
/// order at once or not at all (`NOWAIT`: with a row another session holds,
/// the batch goes on at once as calls, and waits on that row once, not
/// twice), then one `INSERT … ON DUPLICATE KEY UPDATE` with a row per key,
/// in key order, of its hits' summed amount and its first hit's window,
/// which opens a window where it has ended and adds where it is open, as
/// the fixed window's procedure does for the hits one after another, with
/// one reading of the server's clock; a count past the safe range makes
/// that statement fail (NULL into a NOT NULL column, strict mode set for
/// it), changing nothing. Then the keys' rows and that clock, read back
/// before the commit.
fn upsert_sql(store: &MyStore, batch: &[MyPending]) -> String {
    let n = &store.config.names;
    let lock = store.config.lock_s;
    let table = &n.table;
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| batch[a].row.cmp(&batch[b].row));
    // (row, the first hit's windowMs, the summed amount), a key's hits being
    // together in `order` and in the order they were made.
    let mut rows: Vec<(&[u8], i64, i64)> = Vec::new();
    for &i in &order {
        let (MyWork::Call { args, .. }, Some(row)) = (&batch[i].work, batch[i].row.as_deref())
        else {
            continue;
        };
        match rows.last_mut() {
            Some((last, _, sum)) if *last == row => *sum += args[1],
            _ => rows.push((row, args[0], args[1])),
        }
    }
    let mut literals = String::with_capacity(rows.len() * 24);
    for (j, (row, _, _)) in rows.iter().enumerate() {
        if j > 0 {
            literals.push(',');
        }
        schema::hex(row, &mut literals);
    }
    let open = "FLOOR(reset_us / 1000) > FLOOR(@ratestore_now / 1000)";
    let mut sql = String::with_capacity(512 + literals.len() * 3 + rows.len() * 100);
    let _ = write!(
        sql,
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;START TRANSACTION;SET @ratestore_now = {NOW_US};\
         SELECT COUNT(*) FROM {table} WHERE k IN ({literals}) FOR UPDATE NOWAIT;\
         /*M!100301 SET STATEMENT innodb_lock_wait_timeout={lock}, sql_mode='STRICT_ALL_TABLES' FOR */ \
         INSERT /*+ SET_VAR(innodb_lock_wait_timeout={lock}) SET_VAR(sql_mode='STRICT_ALL_TABLES') */ \
         INTO {table} (k, total, reset_us) VALUES "
    );
    for (j, (row, window_ms, amount)) in rows.into_iter().enumerate() {
        if j > 0 {
            sql.push(',');
        }
        sql.push('(');
        schema::hex(row, &mut sql);
        let _ = write!(
            sql,
            ",{amount},CAST(LEAST(CAST(@ratestore_now AS DECIMAL(65,0)) + {}, 9223372036854775807) AS SIGNED))",
            i128::from(window_ms) * 1000
        );
    }
    let _ = write!(
        sql,
        " ON DUPLICATE KEY UPDATE total = IF({open}, IF(ABS(total + VALUES(total)) > {MAX_SAFE}, NULL, \
         total + VALUES(total)), VALUES(total)), reset_us = IF({open}, reset_us, VALUES(reset_us));\
         SELECT HEX(k), total, reset_us, @ratestore_now FROM {table} WHERE k IN ({literals});COMMIT"
    );
    sql
}

/// Each hit's answer from the rows read back (`HEX(k)`, total, reset_us, the
/// clock): a key's hits, last first, answer its total less the amounts made
/// after them; the time left is the window's end less the clock, in ms.
fn upsert_answers(batch: &[MyPending], rows: &[Vec<Option<String>>]) -> Result<Vec<Answer>> {
    let int = |v: Option<&Option<String>>| {
        v.and_then(|c| c.as_deref())
            .and_then(|t| t.parse::<i64>().ok())
            .ok_or_else(schema::wrong_shape)
    };
    let mut found: HashMap<Vec<u8>, (i64, i64)> = HashMap::new();
    let mut now_ms = None;
    for row in rows {
        let key = row
            .first()
            .and_then(|c| c.as_deref())
            .and_then(schema::unhex)
            .ok_or_else(schema::wrong_shape)?;
        let (total, reset_us, now_us) = (int(row.get(1))?, int(row.get(2))?, int(row.get(3))?);
        now_ms = Some(now_us.div_euclid(1000));
        found.insert(key, (total, reset_us.div_euclid(1000)));
    }
    let now_ms = now_ms.ok_or_else(schema::wrong_shape)?;
    let mut after: HashMap<&[u8], i64> = HashMap::new();
    let mut answers = vec![Answer::new(&[]); batch.len()];
    for (i, p) in batch.iter().enumerate().rev() {
        let (MyWork::Call { args, .. }, Some(row)) = (&p.work, p.row.as_deref()) else {
            return Err(schema::wrong_shape());
        };
        let (total, end_ms) = found.get(row).copied().ok_or_else(schema::wrong_shape)?;
        let later = after.entry(row).or_insert(0);
        let count = total - *later;
        *later += args[1];
        let left = end_ms - now_ms;
        if count.abs() > MAX_SAFE || left <= 0 {
            return Err(schema::wrong_shape());
        }
        answers[i] = Answer::new(&[count, left]);
    }
    Ok(answers)
}

/// How an op goes out: which procedure, and its arguments.
fn statement(
    store: &MyStore,
    op: Op,
    args: &Args,
    key: &str,
    row: &[u8],
    sql: &mut String,
) -> usize {
    let n = &store.config.names;
    let lock = store.config.lock_s;
    let mut k = String::with_capacity(row.len() * 2 + 3);
    schema::hex(row, &mut k);
    let call = |sql: &mut String, name: &str, a: [i64; 5]| {
        let _ = write!(
            sql,
            "CALL {name}({},{k},{},{},{},{lock})",
            a[0], a[1], a[2], a[3]
        );
        let _ = a[4];
    };
    let _ = key;
    match op {
        // (op, windowMs, amount, arg): the consume's arg is its limit, the refund's the window it names.
        Op::Hit => call(sql, &n.fixed_fn, [0, args[0], args[1], 0, 0]),
        Op::Consume => call(sql, &n.fixed_fn, [1, args[0], args[2], args[1], 0]),
        Op::Refund => call(sql, &n.fixed_fn, [2, 1, args[0], args[1], 0]),
        Op::SlidingIncrement => call(sql, &n.sliding_fn, [0, args[0], args[1], 0, 0]),
        Op::SlidingDecrement => call(sql, &n.sliding_fn, [1, args[0], args[1], args[2], 0]),
        Op::SlidingConsume => call(sql, &n.sliding_fn, [2, args[0], args[2], args[1], 0]),
        Op::Bucket => {
            let _ = write!(
                sql,
                "CALL {}({k},{},{},{},{},{lock})",
                n.bucket_fn, args[0], args[1], args[2], args[3]
            );
        }
        Op::Unlink => {
            let table = [&n.table, &n.sliding, &n.bucket][args[0] as usize];
            let _ = write!(
                sql,
                "/*M!100301 SET STATEMENT innodb_lock_wait_timeout={lock} FOR */ DELETE \
                 /*+ SET_VAR(innodb_lock_wait_timeout={lock}) */ FROM {table} WHERE k = {k}"
            );
            return 1;
        }
        // A step is not one op (`Op::check` refuses it): as a ping.
        Op::Ping | Op::Takes => {
            sql.push_str("DO 1");
            return 1;
        }
    }
    // A procedure's call answers its row, then an OK.
    2
}

/// A procedure's answer: its first `len` columns, safe integers.
fn answer(reply: Option<StatementResult>, op: Op) -> Result<Answer> {
    let len = op.answer_len();
    let Some(StatementResult::Rows(rows)) = reply else {
        return Err(schema::wrong_shape());
    };
    let Some(row) = rows.first() else {
        return Err(schema::wrong_shape());
    };
    let mut values = [0i64; 6];
    for (i, slot) in values.iter_mut().enumerate().take(len) {
        let v = row
            .get(i)
            .and_then(|c| c.as_deref())
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|v| v.abs() <= MAX_SAFE)
            .ok_or_else(schema::wrong_shape)?;
        *slot = v;
    }
    if op == Op::Hit && values[1] <= 0 {
        return Err(schema::wrong_shape());
    }
    Ok(Answer::new(&values[..len]))
}

impl MyStore {
    fn queue(&self) -> std::sync::MutexGuard<'_, MyQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one op within the store's timeout, in its place in the queue.
    pub async fn run(self: &Arc<Self>, op: Op, args: Args, key: String) -> Result<Answer> {
        self.submit(MyWork::Call { op, args, key }).await
    }

    /// Runs several takes as one step, in its place in the queue: every
    /// take made, or none. Answers each take's answer, in order (as it found
    /// its row when not every take allowed).
    pub async fn step(self: &Arc<Self>, takes: Vec<(Op, Args, String)>) -> Result<Vec<Answer>> {
        let work = Arc::new(MyStepWork {
            takes: takes
                .into_iter()
                .map(|(op, args, key)| (op, args, schema::row_key(&key)))
                .collect(),
            answers: std::sync::Mutex::new(None),
        });
        self.submit(MyWork::Step(Arc::clone(&work))).await?;
        let answers = work
            .answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        answers.ok_or(Error::Internal("a step ran without answers"))
    }

    /// Deletes every counter and state of the store's tables, in its place in the queue.
    pub async fn reset_all(self: &Arc<Self>) -> Result<()> {
        self.submit(MyWork::ResetAll).await.map(|_| ())
    }

    async fn submit(self: &Arc<Self>, work: MyWork) -> Result<Answer> {
        let (answer, result) = oneshot::channel();
        let sent = Arc::new(AtomicBool::new(false));
        let row = match &work {
            MyWork::Call { op: Op::Ping, .. } | MyWork::ResetAll | MyWork::Step(_) => None,
            MyWork::Call { key, .. } => Some(schema::row_key(key)),
        };
        let id = {
            let mut queue = self.queue();
            let id = queue.next_id;
            queue.next_id += 1;
            queue.waiting.push_back(MyPending {
                id,
                work,
                row,
                sent: Arc::clone(&sent),
                solo: false,
                answer,
            });
            id
        };
        self.start_flushers();
        let ms = self.config.timeout_ms;
        match tokio::time::timeout(Duration::from_millis(ms), result).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(with_sent(
                Error::Sql {
                    store: Backend::Mysql,
                    code: "ERR_CONNECTION",
                    text: "the store was closed before MySQL answered".into(),
                    sent: None,
                },
                sent.load(Ordering::Relaxed),
            )),
            Err(_) => {
                // Still queued: it is taken out and never sent.
                let mut queue = self.queue();
                if let Some(at) = queue.waiting.iter().position(|p| p.id == id) {
                    queue.waiting.remove(at);
                }
                drop(queue);
                Err(with_sent(timeout_error(ms), sent.load(Ordering::Relaxed)))
            }
        }
    }

    /// Starts a batch on each free connection while calls wait.
    fn start_flushers(self: &Arc<Self>) {
        loop {
            let batch = {
                let mut queue = self.queue();
                if queue.waiting.is_empty() || queue.free.is_empty() {
                    return;
                }
                let batch = queue.take();
                if batch.is_empty() {
                    return;
                }
                queue.flushing += 1;
                let slot = queue.free.pop().unwrap_or(0);
                (slot, batch)
            };
            let store = Arc::clone(self);
            // Its own task: a caller that stops waiting never stops a batch of other calls.
            tokio::spawn(async move { store.flush(batch.0, batch.1).await });
        }
    }

    /// Sends batches on connection `slot` while calls wait.
    async fn flush(self: Arc<Self>, slot: usize, mut batch: Vec<MyPending>) {
        loop {
            let rows: Vec<Vec<u8>> = batch.iter().flat_map(MyPending::rows).collect();
            let again = self.send(slot, batch).await;
            let next = {
                let mut queue = self.queue();
                // Calls that did not run go back to the front, in order.
                for p in again.into_iter().rev() {
                    p.sent.store(false, Ordering::Relaxed);
                    queue.waiting.push_front(p);
                }
                queue.release(&rows);
                queue.flushing -= 1;
                let next = queue.take();
                if next.is_empty() {
                    queue.free.push(slot);
                    None
                } else {
                    queue.flushing += 1;
                    Some(next)
                }
            };
            // Keys this batch held may let other connections go on.
            self.start_flushers();
            match next {
                Some(next) => batch = next,
                None => return,
            }
        }
    }

    /// Sends one batch on connection `slot` and answers each call that ran;
    /// answers the calls that did not run, to go back to the queue.
    async fn send(&self, slot: usize, mut batch: Vec<MyPending>) -> Vec<MyPending> {
        let ms = self.config.timeout_ms;
        let mut guard = self.slots[slot].lock().await;
        let generation = self.generation.load(Ordering::Relaxed);
        let mut conn = match guard.take() {
            Some((conn, made)) if made == generation && !conn.is_dead() => conn,
            _ => match self.connect().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    for p in batch {
                        let _ = p.answer.send(Err(with_sent(e.clone(), false)));
                    }
                    return Vec::new();
                }
            },
        };
        batch.retain(|p| !p.answer.is_closed());
        if batch.is_empty() {
            *guard = Some((conn, generation));
            return Vec::new();
        }
        if let [one] = batch.as_slice() {
            if let MyWork::ResetAll = one.work {
                one.sent.store(true, Ordering::Relaxed);
                let result = self.reset_all_on(&mut conn).await;
                if result.is_ok()
                    || matches!(
                        result,
                        Err(Error::Sql {
                            store: Backend::Mysql,
                            code: "ERR_MYSQL",
                            ..
                        })
                    )
                {
                    *guard = Some((conn, generation));
                }
                let p = batch.pop().unwrap_or_else(|| unreachable!());
                let _ = p.answer.send(
                    result
                        .map(|()| Answer::new(&[]))
                        .map_err(|e| with_sent(e, true)),
                );
                return Vec::new();
            }
            if let MyWork::Step(step) = &one.work {
                one.sent.store(true, Ordering::Relaxed);
                let (result, keep) = self.run_step(&mut conn, step).await;
                if keep {
                    *guard = Some((conn, generation));
                }
                let p = batch.pop().unwrap_or_else(|| unreachable!());
                let _ = p.answer.send(result.map(|()| Answer::new(&[])));
                return Vec::new();
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
        if upsert_fits(&batch) {
            for p in &batch {
                p.sent.store(true, Ordering::Relaxed);
            }
            match self.upsert(&mut conn, &batch, deadline).await {
                Upsert::Answered(answers) => {
                    *guard = Some((conn, generation));
                    drop(guard);
                    for (p, answer) in batch.into_iter().zip(answers) {
                        let _ = p.answer.send(Ok(answer));
                    }
                    return Vec::new();
                }
                Upsert::Calls => {}
                Upsert::Failed { error, kill } => {
                    if kill {
                        self.kill(conn.thread_id);
                    }
                    for p in batch {
                        let _ = p.answer.send(Err(error.clone()));
                    }
                    return Vec::new();
                }
            }
        }
        // Consecutive hits on one key (amount above 0, one windowMs, nothing else on the key between
        // them) go out as one call of their summed amount: each answers the count it would have seen
        // one after another (the last's count less the amounts after it), as if they ran back to back.
        let mut units: Vec<Vec<usize>> = Vec::with_capacity(batch.len());
        let mut open: HashMap<&[u8], (usize, i64)> = HashMap::new();
        for (i, p) in batch.iter().enumerate() {
            let MyWork::Call { op, args, .. } = &p.work else {
                unreachable!("resetAll and a step go alone")
            };
            let row = p.row.as_deref();
            let joins = !p.solo && *op == Op::Hit && args[1] > 0;
            if let (true, Some(row)) = (joins, row) {
                if let Some((u, sum)) = open.get_mut(row) {
                    let first = &batch[units[*u][0]];
                    let same =
                        matches!(&first.work, MyWork::Call { args: a, .. } if a[0] == args[0]);
                    if same && *sum + args[1] <= MAX_SAFE {
                        *sum += args[1];
                        units[*u].push(i);
                        continue;
                    }
                }
            }
            units.push(vec![i]);
            if let Some(row) = row {
                if joins {
                    open.insert(row, (units.len() - 1, args[1]));
                } else {
                    open.remove(row);
                }
            }
        }
        drop(open);
        let mut sql = String::with_capacity(units.len() * 96);
        let mut expected = Vec::with_capacity(units.len());
        for unit in &units {
            if !sql.is_empty() {
                sql.push(';');
            }
            let p = &batch[unit[0]];
            let MyWork::Call { op, args, key } = &p.work else {
                unreachable!("resetAll goes alone")
            };
            let mut args = *args;
            if unit.len() > 1 {
                args[1] = unit
                    .iter()
                    .map(|&i| match &batch[i].work {
                        MyWork::Call { args, .. } => args[1],
                        MyWork::ResetAll | MyWork::Step(_) => 0,
                    })
                    .sum();
            }
            let row = p.row.as_deref().unwrap_or(&[]);
            expected.push(statement(self, *op, &args, key, row, &mut sql));
            for &i in unit {
                batch[i].sent.store(true, Ordering::Relaxed);
            }
        }
        let outcome = tokio::time::timeout_at(deadline, conn.query(&sql)).await;
        let (replies, failure) = match outcome {
            Ok(Ok(done)) => done,
            Ok(Err(f)) => {
                let e = with_sent(self.error(f), true);
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return Vec::new();
            }
            Err(_) => {
                self.kill(conn.thread_id);
                let e = with_sent(timeout_error(ms), true);
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return Vec::new();
            }
        };
        *guard = Some((conn, generation));
        drop(guard);
        let mut replies = VecDeque::from(replies);
        let mut failure = failure;
        let mut slots: Vec<Option<MyPending>> = batch.into_iter().map(Some).collect();
        let mut left = Vec::new();
        let mut failed = false;
        for (unit, need) in units.iter().zip(expected) {
            if failed {
                left.extend(unit.iter().copied());
                continue;
            }
            let (op, arg0) = match slots[unit[0]].as_ref().map(|p| &p.work) {
                Some(MyWork::Call { op, args, .. }) => (*op, args[0]),
                _ => continue,
            };
            if replies.len() >= need {
                let result = match op {
                    Op::Unlink | Op::Ping => match replies.pop_front() {
                        Some(StatementResult::Done { affected }) => {
                            Ok(Answer::new(&[if op == Op::Ping {
                                1
                            } else {
                                affected as i64
                            }]))
                        }
                        _ => Err(schema::wrong_shape()),
                    },
                    _ => {
                        let row = replies.pop_front();
                        replies.pop_front();
                        answer(row, op)
                    }
                };
                // The unit's members, last first: each answers the count less the amounts after it.
                let mut after = 0;
                for &i in unit.iter().rev() {
                    let Some(p) = slots[i].take() else { continue };
                    let amount = match &p.work {
                        MyWork::Call { args, .. } => args[1],
                        MyWork::ResetAll | MyWork::Step(_) => 0,
                    };
                    let mine = result.clone().map(|mut a| {
                        if unit.len() > 1 {
                            a.values[0] -= after;
                        }
                        a
                    });
                    after += amount;
                    let _ = p.answer.send(mine);
                }
                continue;
            }
            // This unit's statement failed; the rest did not run.
            failed = true;
            let result = match failure.take() {
                // A state's table that was never created (createTable: false) holds nothing.
                Some(MyFailure::Server {
                    code: codes::NO_SUCH_TABLE,
                    ..
                }) if op == Op::Unlink && arg0 > 0 => Ok(Answer::new(&[0])),
                Some(f) => Err(self.call_error(f)),
                None => Err(schema::wrong_shape()),
            };
            if unit.len() > 1 && matches!(result, Err(Error::CountOutOfRange)) {
                // The sum left the range, though some of the hits alone may not: each again, on its own.
                for &i in unit {
                    if let Some(p) = slots[i].as_mut() {
                        p.solo = true;
                    }
                }
                left.extend(unit.iter().copied());
                continue;
            }
            for &i in unit {
                if let Some(p) = slots[i].take() {
                    let _ = p.answer.send(result.clone());
                }
            }
        }
        left.sort_unstable();
        left.into_iter().filter_map(|i| slots[i].take()).collect()
    }

    /// Sends the batch as one upsert (see [`upsert_sql`]) within `deadline`.
    async fn upsert(
        &self,
        conn: &mut super::proto::MyConn,
        batch: &[MyPending],
        deadline: tokio::time::Instant,
    ) -> Upsert {
        let ms = self.config.timeout_ms;
        let sql = upsert_sql(self, batch);
        let failed = |error: Error, kill: bool| Upsert::Failed {
            error: with_sent(error, true),
            kill,
        };
        let (replies, failure) = match tokio::time::timeout_at(deadline, conn.query(&sql)).await {
            Ok(Ok(done)) => done,
            Ok(Err(f)) => return failed(self.error(f), false),
            Err(_) => return failed(timeout_error(ms), true),
        };
        if failure.is_some() {
            // Nothing of it is kept: the failed statement changed nothing, and the transaction goes.
            return match tokio::time::timeout_at(deadline, conn.query("ROLLBACK")).await {
                Ok(Ok((_, None))) => Upsert::Calls,
                Ok(Ok((_, Some(f)))) | Ok(Err(f)) => failed(self.error(f), false),
                Err(_) => failed(timeout_error(ms), true),
            };
        }
        // SET TRANSACTION, START TRANSACTION, SET, SELECT … FOR UPDATE, INSERT, SELECT, COMMIT.
        match replies.get(5) {
            Some(StatementResult::Rows(rows)) if replies.len() == 7 => {
                match upsert_answers(batch, rows) {
                    Ok(answers) => Upsert::Answered(answers),
                    Err(e) => failed(e, false),
                }
            }
            _ => failed(schema::wrong_shape(), false),
        }
    }

    /// A statement's failure, as its call rejects.
    pub(super) fn call_error(&self, f: MyFailure) -> Error {
        match f {
            MyFailure::Server { code: codes::LOCK_WAIT_TIMEOUT, .. } => Error::Sql {
                store: Backend::Mysql,
                code: "ERR_TIMEOUT",
                text: "the key's row stayed locked by another session for the store's lock wait (MySQL 1205); the \
                       call was rolled back: it was sent, counted nothing, and is not sent again"
                    .into(),
                sent: Some(true),
            },
            MyFailure::Server { code: codes::QUERY_INTERRUPTED, .. } => Error::Sql {
                store: Backend::Mysql,
                code: "ERR_TIMEOUT",
                text: "MySQL interrupted the statement (1317: KILL QUERY, or max_statement_time); it was rolled back: \
                       the call was sent, counted nothing, and is not sent again"
                    .into(),
                sent: Some(true),
            },
            f => {
                let e = self.error(f);
                match e {
                    Error::Sql {
                        store: Backend::Mysql,
                        code,
                        text,
                        sent: None,
                    } => Error::Sql {
                        store: Backend::Mysql,
                        code,
                        text,
                        sent: Some(true),
                    },
                    other => other,
                }
            }
        }
    }

    async fn reset_all_on(&self, conn: &mut super::proto::MyConn) -> Result<()> {
        let n = &self.config.names;
        for (state, table) in [&n.table, &n.sliding, &n.bucket].into_iter().enumerate() {
            let run = tokio::time::timeout(
                Duration::from_millis(self.config.timeout_ms),
                conn.query(&format!("DELETE FROM {table}")),
            )
            .await;
            match run {
                Ok(Ok((_, None))) => {}
                Ok(Ok((
                    _,
                    Some(MyFailure::Server {
                        code: codes::NO_SUCH_TABLE,
                        ..
                    }),
                ))) if state > 0 => {}
                Ok(Ok((_, Some(f)))) => return Err(self.call_error(f)),
                Ok(Err(f)) => return Err(with_sent(self.error(f), true)),
                Err(_) => {
                    self.kill(conn.thread_id);
                    return Err(with_sent(timeout_error(self.config.timeout_ms), true));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(
        queue: &mut MyQueue,
        id: u64,
        key: Option<&str>,
        reset_all: bool,
    ) -> oneshot::Receiver<Result<Answer>> {
        let (answer, rx) = oneshot::channel();
        let work = if reset_all {
            MyWork::ResetAll
        } else {
            MyWork::Call {
                op: Op::Hit,
                args: [60_000, 1, 0, 0],
                key: key.unwrap_or("").into(),
            }
        };
        queue.waiting.push_back(MyPending {
            id,
            work,
            row: key.map(schema::row_key),
            sent: Arc::new(AtomicBool::new(false)),
            solo: false,
            answer,
        });
        rx
    }

    #[test]
    fn a_batch_skips_the_keys_on_their_way_and_keeps_each_key_s_order() {
        let mut q = MyQueue::new(2);
        let _kept: Vec<_> = [(0, "a"), (1, "b"), (2, "a"), (3, "c")]
            .into_iter()
            .map(|(id, k)| pending(&mut q, id, Some(k), false))
            .collect();
        let first = q.take();
        assert_eq!(first.iter().map(|p| p.id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let _more: Vec<_> = [(4, "a"), (5, "d"), (6, "a")]
            .into_iter()
            .map(|(id, k)| pending(&mut q, id, Some(k), false))
            .collect();
        let second = q.take();
        assert_eq!(second.iter().map(|p| p.id).collect::<Vec<_>>(), [5]);
        q.release(
            &first
                .iter()
                .filter_map(|p| p.row.clone())
                .collect::<Vec<_>>(),
        );
        let third = q.take();
        assert_eq!(third.iter().map(|p| p.id).collect::<Vec<_>>(), [4, 6]);
    }

    #[test]
    fn reset_all_waits_for_the_batches_on_their_way_and_holds_back_what_follows() {
        let mut q = MyQueue::new(2);
        let _a = pending(&mut q, 0, Some("a"), false);
        let _r = pending(&mut q, 1, None, true);
        let _b = pending(&mut q, 2, Some("b"), false);
        let first = q.take();
        assert_eq!(first.iter().map(|p| p.id).collect::<Vec<_>>(), [0]);
        q.flushing = 1;
        assert!(
            q.take().is_empty(),
            "resetAll waits for the batch on its way"
        );
        q.flushing = 0;
        q.release(&[schema::row_key("a")]);
        assert_eq!(q.take().iter().map(|p| p.id).collect::<Vec<_>>(), [1]);
        let _c = pending(&mut q, 3, Some("a"), false);
        assert!(
            q.take().is_empty(),
            "nothing goes out on another connection while resetAll is on its way"
        );
        q.release(&[]);
        assert_eq!(q.take().iter().map(|p| p.id).collect::<Vec<_>>(), [2, 3]);
    }
}
