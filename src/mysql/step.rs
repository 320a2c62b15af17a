//! Several takes as one step on mysqlStore: a limiter's limits on a key,
//! taken from all or from none, in one transaction of their own on one
//! connection. Its rows are locked (`SELECT … FOR UPDATE`) in one order, the
//! same in every instance: by table, then by key; the database's clock is
//! read once they are held; each take is computed with its algorithm's pure
//! function (as sqliteStore's are, `crate::sqlite::apply`, the rules the
//! procedures port); when every take allows, the rows are written and the
//! transaction commits, else it rolls back and nothing is written. Two round
//! trips: the locks and reads, then the writes with `COMMIT` (or
//! `ROLLBACK`). A row two sessions insert at once (1062) or a deadlock
//! (1213) rolls the step back whole and starts it over. The session's lock
//! wait is set for the step and put back in its last query, so nothing stays
//! on the session.

use std::fmt::Write as _;
use std::time::Duration;

use super::proto::{MyConn, MyFailure, StatementResult};
use super::{codes, schema, with_sent, MyStore};
use crate::errors::{Backend, Error, Result};
use crate::ops::{Answer, Args, Op};
use crate::sqlite::apply::{self, Row, RowWrite};

/// Tries of a step whose rows were contended (1062, 1213) before it fails.
const TRIES: usize = 5;

/// A step's takes `(op, args, row key)`, and, once it has run, their answers.
pub struct MyStepWork {
    pub takes: Vec<(Op, Args, Vec<u8>)>,
    pub answers: std::sync::Mutex<Option<Vec<Answer>>>,
}

/// One row a step reads and may write: its table (by kind) and key.
struct StepRow<'k> {
    kind: u8,
    key: &'k [u8],
    /// Whether the row exists (read), and its values as the step leaves them.
    had: bool,
    row: Option<Row>,
    changed: bool,
}

/// What went wrong in a try, and whether to try again.
enum StepOutcome {
    Done,
    Again,
    Failed(Error),
}

impl MyStore {
    fn tables(&self) -> [&str; 3] {
        let n = &self.config.names;
        [&n.table, &n.sliding, &n.bucket]
    }

    /// Runs `step` on `conn`. Answers whether the connection may serve the
    /// next batch (no transaction of the step left open on it).
    pub(super) async fn run_step(
        &self,
        conn: &mut MyConn,
        step: &MyStepWork,
    ) -> (Result<()>, bool) {
        let ms = self.config.timeout_ms;
        let run = async {
            for _ in 0..TRIES {
                match self.try_step(conn, step).await {
                    Ok(StepOutcome::Done) => return (Ok(()), true),
                    Ok(StepOutcome::Again) => continue,
                    Ok(StepOutcome::Failed(e)) => return (Err(e), true),
                    Err(e) => return (Err(e), false),
                }
            }
            (
                Err(Error::Sql {
                    store: Backend::Mysql,
                    code: "ERR_MYSQL",
                    text: format!(
                        "MySQL answered 1213 (40001): the step's rows were contended {TRIES} times in a row; \
                         it was rolled back each time and counted nothing"
                    ),
                    sent: Some(true),
                }),
                true,
            )
        };
        match tokio::time::timeout(Duration::from_millis(ms), run).await {
            Ok(done) => done,
            Err(_) => {
                self.kill(conn.thread_id);
                (Err(with_sent(super::timeout_error(ms), true)), false)
            }
        }
    }

    /// Rolls back what a try left open and puts the lock wait back: the
    /// connection's error (it is then dropped, and MySQL rolls back) if that
    /// failed.
    async fn roll_back(&self, conn: &mut MyConn) -> Result<()> {
        match conn
            .query("ROLLBACK; SET SESSION innodb_lock_wait_timeout = @ratestore_wait")
            .await
        {
            Ok((_, None)) => Ok(()),
            Ok((_, Some(f))) | Err(f) => Err(with_sent(self.error(f), true)),
        }
    }

    /// One try: `Err` when the connection can't be used any more.
    async fn try_step(&self, conn: &mut MyConn, step: &MyStepWork) -> Result<StepOutcome> {
        // The lock order: by table, then key; a key's takes in the order they were made.
        let mut slots: Vec<StepRow<'_>> = Vec::new();
        for (op, args, key) in &step.takes {
            let kind = apply::kind(*op, args);
            if !slots.iter().any(|s| s.kind == kind && s.key == &key[..]) {
                slots.push(StepRow {
                    kind,
                    key,
                    had: false,
                    row: None,
                    changed: false,
                });
            }
        }
        slots.sort_by(|a, b| (a.kind, a.key).cmp(&(b.kind, b.key)));
        let tables = self.tables();
        let mut sql = format!(
            "SET @ratestore_wait = @@SESSION.innodb_lock_wait_timeout; \
             SET SESSION innodb_lock_wait_timeout = {}; \
             SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION",
            self.config.lock_s
        );
        for s in &slots {
            let mut k = String::new();
            schema::hex(s.key, &mut k);
            let columns = match s.kind {
                0 => "total, 0, 0, reset_us",
                1 => "start_us, current, previous, expires_us",
                _ => "tokens, at_us, 0, expires_us",
            };
            let _ = write!(
                sql,
                "; SELECT {columns} FROM {} WHERE k = {k} FOR UPDATE",
                tables[usize::from(s.kind)]
            );
        }
        sql.push_str(
            "; SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
        );
        let (replies, failure) = match conn.query(&sql).await {
            Ok(done) => done,
            Err(f) => return Err(with_sent(self.error(f), true)),
        };
        if let Some(f) = failure {
            self.roll_back(conn).await?;
            return Ok(self.failed(f));
        }
        // Four statements set the transaction up; then a result per row, then the clock.
        let mut results = replies.into_iter().filter_map(|r| match r {
            StatementResult::Rows(rows) => Some(rows),
            StatementResult::Done { .. } => None,
        });
        let number = |v: &Option<String>| v.as_deref().and_then(|t| t.parse::<i64>().ok());
        for s in slots.iter_mut() {
            let Some(rows) = results.next() else {
                self.roll_back(conn).await?;
                return Ok(StepOutcome::Failed(schema::wrong_shape()));
            };
            if let Some(r) = rows.first() {
                let values: Option<Vec<i64>> = r.iter().take(4).map(number).collect();
                match values.as_deref() {
                    Some([a, b, c, ends]) => {
                        s.had = true;
                        s.row = Some(Row {
                            a: *a,
                            b: *b,
                            c: *c,
                            ends_at: (*ends).max(0) as u64,
                        });
                    }
                    _ => {
                        self.roll_back(conn).await?;
                        return Ok(StepOutcome::Failed(schema::wrong_shape()));
                    }
                }
            }
        }
        let now = results
            .next()
            .and_then(|rows| rows.first().and_then(|r| r.first().and_then(number)))
            .filter(|&n| n > 0);
        let Some(now) = now else {
            self.roll_back(conn).await?;
            return Ok(StepOutcome::Failed(schema::wrong_shape()));
        };
        let now = now as u64;
        let mut answers = Vec::with_capacity(step.takes.len());
        for (op, args, key) in &step.takes {
            let kind = apply::kind(*op, args);
            let Some(s) = slots
                .iter_mut()
                .find(|s| s.kind == kind && s.key == &key[..])
            else {
                continue;
            };
            let stored = s.row.filter(|r| apply::live(kind, r, now));
            match apply::apply(*op, args, stored, now) {
                Ok((answer, write)) => {
                    match write {
                        RowWrite::Keep => {}
                        RowWrite::Put(r) => {
                            s.row = Some(r);
                            s.changed = true;
                        }
                        RowWrite::Drop => {
                            s.changed |= s.row.is_some();
                            s.row = None;
                        }
                    }
                    answers.push(answer);
                }
                Err(e) => {
                    self.roll_back(conn).await?;
                    return Ok(StepOutcome::Failed(e));
                }
            }
        }
        let allowed = answers.iter().all(|a| a.values[0] == 1);
        let mut sql = String::new();
        if allowed {
            for s in slots.iter().filter(|s| s.changed) {
                let mut k = String::new();
                schema::hex(s.key, &mut k);
                let table = tables[usize::from(s.kind)];
                match (s.had, s.row) {
                    (true, None) => {
                        let _ = write!(sql, "DELETE FROM {table} WHERE k = {k}; ");
                    }
                    (false, None) => {}
                    (had, Some(r)) => {
                        let ends = apply::column_time(r.ends_at);
                        let (columns, values) = match s.kind {
                            0 => ("total, reset_us", format!("{}, {ends}", r.a)),
                            1 => (
                                "start_us, current, previous, expires_us",
                                format!("{}, {}, {}, {ends}", r.a, r.b, r.c),
                            ),
                            _ => (
                                "tokens, at_us, expires_us",
                                format!("{}, {}, {ends}", r.a, r.b),
                            ),
                        };
                        if had {
                            let set: Vec<String> = columns
                                .split(", ")
                                .zip(values.split(", "))
                                .map(|(c, v)| format!("{c} = {v}"))
                                .collect();
                            let _ = write!(
                                sql,
                                "UPDATE {table} SET {} WHERE k = {k}; ",
                                set.join(", ")
                            );
                        } else {
                            let _ = write!(
                                sql,
                                "INSERT INTO {table} (k, {columns}) VALUES ({k}, {values}); "
                            );
                        }
                    }
                }
            }
            sql.push_str("COMMIT; SET SESSION innodb_lock_wait_timeout = @ratestore_wait");
        } else {
            sql.push_str("ROLLBACK; SET SESSION innodb_lock_wait_timeout = @ratestore_wait");
        }
        match conn.query(&sql).await {
            Ok((_, None)) => {}
            Ok((_, Some(f))) => {
                self.roll_back(conn).await?;
                return Ok(self.failed(f));
            }
            Err(f) => return Err(with_sent(self.error(f), true)),
        }
        *step.answers.lock().unwrap_or_else(|e| e.into_inner()) = Some(answers);
        Ok(StepOutcome::Done)
    }

    /// A statement's failure in a try (rolled back): tried again when two
    /// sessions met on a row (1062, 1213), else the step's error.
    fn failed(&self, f: MyFailure) -> StepOutcome {
        match f {
            MyFailure::Server {
                code: codes::DUP_ENTRY | codes::LOCK_DEADLOCK,
                ..
            } => StepOutcome::Again,
            f => StepOutcome::Failed(self.call_error(f)),
        }
    }
}
