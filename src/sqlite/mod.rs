//! sqliteStore's core: every algorithm's state in one table of a SQLite file
//! (compiled in), in WAL mode, shared by every process of the host that
//! opens the same file. Each store has one connection and a thread of its
//! own. A call made alone (the JS side says so: see lib/threaded.js) while
//! the store is idle (nothing queued, the thread not running, the file's
//! write lock free at once) runs on the caller's thread in its own
//! `BEGIN IMMEDIATE … COMMIT` and is answered there, as a synchronous SQLite
//! binding's would be; with `synchronous: 'normal'` only, where a commit
//! waits for no disk flush. Any other call goes to the thread: the calls
//! made while a batch runs wait in a channel, and the next batch takes them
//! all in one transaction (each call is answered only once its batch has
//! committed). So the caller's thread never waits: another process holding
//! the write lock sends the call to the thread, which waits for it
//! (SQLite's busy handler) up to the calls' `timeoutMs`, then they reject
//! unsent; and the WAL's checkpoints (a disk flush) run on the thread,
//! holding the connection (see `CHECKPOINT_AFTER`). A transaction that fails
//! is rolled back whole, so a call counts exactly once or not at all.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};

use crate::delivery::{Completion, Delivery};
use crate::errors::{Backend, Error, Result};
use crate::ops::{Answer, Args, Op};

pub mod apply;
use apply::{Row, RowWrite};

/// The file a store opens when no `path` is given, in the working directory.
pub const DEFAULT_PATH: &str = "ratestore.sqlite3";
pub const DEFAULT_TIMEOUT_MS: u64 = 2000;
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;
/// The table every store keeps its rows in.
pub const TABLE: &str = "ratestore_counters";
/// Rows one sweep step looks at (and deletes at most), in one short transaction.
const SWEEP_BATCH: i64 = 500;
/// The most calls one transaction takes.
const MAX_BATCH: usize = 4096;
/// The WAL's size in pages at which the store's thread checkpoints it into
/// the file, as SQLite's own automatic checkpoint does (1000 by default):
/// here off the caller's thread, since a checkpoint flushes the disk.
const CHECKPOINT_AFTER: u64 = 1000;

/// SQLite's `synchronous` setting in WAL mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronous {
    /// A commit is in the WAL file (the OS's cache) when the call answers: it
    /// survives the process's death (kill -9), not the host's (power loss,
    /// kernel crash), which may lose the last commits, never the file.
    Normal,
    /// Each commit is fsynced before its calls answer: it survives the host's
    /// death too, at a disk flush per batch.
    Full,
}

/// The options as JavaScript gave them (checked there).
#[derive(Clone, Debug, Default)]
pub struct SqliteOptions {
    pub path: Option<String>,
    pub timeout_ms: Option<u64>,
    pub synchronous: Option<String>,
    pub sweep_interval_ms: Option<u64>,
}

/// The settings.
#[derive(Clone, Debug)]
pub struct SqliteConfig {
    pub path: String,
    pub timeout_ms: u64,
    pub synchronous: Synchronous,
    pub sweep_interval_ms: u64,
}

fn config_error(text: &str) -> Error {
    Error::Sql {
        store: Backend::Sqlite,
        code: "ERR_CONFIG",
        text: text.into(),
        sent: Some(false),
    }
}

impl SqliteConfig {
    pub fn resolve(options: &SqliteOptions) -> Result<SqliteConfig> {
        let path = options
            .path
            .clone()
            .unwrap_or_else(|| DEFAULT_PATH.to_string());
        if path.is_empty() || path.contains('\0') {
            return Err(config_error(
                "path must name a file (or be ':memory:'), without NUL characters",
            ));
        }
        let synchronous = match options.synchronous.as_deref() {
            None | Some("normal") => Synchronous::Normal,
            Some("full") => Synchronous::Full,
            Some(_) => return Err(config_error("synchronous must be 'normal' or 'full'")),
        };
        Ok(SqliteConfig {
            path,
            timeout_ms: options.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            synchronous,
            sweep_interval_ms: options
                .sweep_interval_ms
                .unwrap_or(DEFAULT_SWEEP_INTERVAL_MS),
        })
    }
}

/// One call on its way to the store's thread.
pub struct Call {
    pub id: u32,
    pub op: Op,
    pub args: Args,
    /// The key's bytes (WTF-8).
    pub key: Vec<u8>,
    pub deadline: Instant,
}

/// What `resetAll()` hears back.
pub type ResetDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Several takes (each a consume, sliding consume or token bucket, on its
/// key, answered under its own id) made as one step: all, or none.
pub struct Step {
    pub takes: Vec<Call>,
}

impl Step {
    /// Checks that `takes` can be a step (see [`crate::ops::check_step`]).
    pub fn new(takes: Vec<Call>) -> Result<Step> {
        crate::ops::check_step(takes.iter().map(|t| t.op))?;
        Ok(Step { takes })
    }

    fn deadline(&self) -> Instant {
        self.takes
            .iter()
            .map(|t| t.deadline)
            .min()
            .expect("not empty")
    }
}

/// What a batch runs, in the order it was queued.
enum SqliteWork {
    Call(Call),
    Step(Step),
}

impl SqliteWork {
    fn deadline(&self) -> Instant {
        match self {
            SqliteWork::Call(c) => c.deadline,
            SqliteWork::Step(s) => s.deadline(),
        }
    }

    /// The ids its answers go under.
    fn ids(&self) -> Vec<u32> {
        match self {
            SqliteWork::Call(c) => vec![c.id],
            SqliteWork::Step(s) => s.takes.iter().map(|t| t.id).collect(),
        }
    }
}

enum Message {
    Call(Call),
    Step(Step),
    ResetAll(ResetDone, Instant),
    /// Checkpoints the WAL (asked for by a call run on the caller's thread).
    Checkpoint,
}

/// What the store and its thread share: the connection's owner, and the
/// count of messages sent to the thread and not yet run. A call runs on the
/// caller's thread only while that count is 0 and the worker is free, so
/// it never overtakes a call made before it.
struct SqliteShared {
    worker: Mutex<Worker>,
    queued: AtomicUsize,
}

impl SqliteShared {
    fn lock(&self) -> MutexGuard<'_, Worker> {
        self.worker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The worker, if no one holds it now.
    fn try_lock(&self) -> Option<MutexGuard<'_, Worker>> {
        match self.worker.try_lock() {
            Ok(worker) => Some(worker),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// How a call run on the caller's thread went.
enum Inline {
    Answered(Answer),
    /// It failed (rolled back, or never begun: nothing counted).
    Failed(Completion),
    /// It did not run: it goes to the store's thread.
    Queue(Call),
}

/// The counters a store's thread keeps about it.
#[derive(Default)]
pub struct Counts {
    /// Expired rows the sweeper deleted.
    pub swept: AtomicU64,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Transactions that waited for another connection's lock (SQLITE_BUSY
    /// at their first try) and got it within their time.
    pub busy_waits: AtomicU64,
}

/// A store: the sending end of its thread's channel, and what it shares
/// with the thread. Dropping it (or `close`) lets the thread finish the
/// calls queued and end.
pub struct SqliteStore {
    sender: Mutex<Option<Sender<Message>>>,
    shared: Arc<SqliteShared>,
    /// Whether an idle store's call runs on the caller's thread (only where a
    /// commit flushes no disk: `synchronous: 'normal'`).
    inline: bool,
    pub timeout: Duration,
}

impl SqliteStore {
    /// Starts the store's thread; the file is opened by its first call.
    pub fn start(
        config: SqliteConfig,
        delivery: Arc<Delivery>,
        counts: Arc<Counts>,
    ) -> Result<SqliteStore> {
        let (sender, receiver) = mpsc::channel();
        let timeout = Duration::from_millis(config.timeout_ms);
        let inline = config.synchronous == Synchronous::Normal;
        let interval = Duration::from_millis(config.sweep_interval_ms);
        let shared = Arc::new(SqliteShared {
            worker: Mutex::new(Worker {
                config,
                conn: None,
                delivery,
                counts,
                last_now: 0,
                cursor: None,
                wal_frames: Box::new(AtomicU64::new(0)),
            }),
            queued: AtomicUsize::new(0),
        });
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("ratestore-sqlite".into())
            .spawn(move || serve(&theirs, &receiver, interval))
            .map_err(|_| Error::Internal("the store's thread could not be started"))?;
        Ok(SqliteStore {
            sender: Mutex::new(Some(sender)),
            shared,
            inline,
            timeout,
        })
    }

    fn send(&self, message: Message) -> std::result::Result<(), Message> {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        match sender.as_ref() {
            Some(s) => self.send_on(s, message),
            None => Err(message),
        }
    }

    /// Sends a message to the thread, counted in `queued` until it has run.
    fn send_on(
        &self,
        sender: &Sender<Message>,
        message: Message,
    ) -> std::result::Result<(), Message> {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        sender.send(message).map_err(|e| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            e.0
        })
    }

    /// Makes a call: runs it at once on this thread where `at_once` asks for
    /// it and the store is idle (see the module's docs), answering
    /// `Ok(Some(answer))`; else queues it to the store's thread, answering
    /// `Ok(None)` (it is answered through the delivery, as is a call that
    /// failed here). `Err(Closed)` once the store is closed.
    pub fn call(&self, mut call: Call, at_once: bool) -> Result<Option<Answer>> {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let sender = sender.as_ref().ok_or(Error::Closed)?;
        if at_once && self.inline && self.shared.queued.load(Ordering::Acquire) == 0 {
            if let Some(mut worker) = self.shared.try_lock() {
                match worker.inline(call) {
                    Inline::Answered(answer) => {
                        let checkpoint = worker.checkpoint_due();
                        drop(worker);
                        if checkpoint {
                            // Queued, it keeps every call off this thread until it has run. If it
                            // can't be sent, the store is closing.
                            let _ = self.send_on(sender, Message::Checkpoint);
                        }
                        return Ok(Some(answer));
                    }
                    Inline::Failed(failed) => {
                        // Rejected as the thread's failures are: through the delivery.
                        worker.delivery.push(failed);
                        return Ok(None);
                    }
                    Inline::Queue(back) => call = back,
                }
            }
        }
        self.send_on(sender, Message::Call(call))
            .map(|()| None)
            .map_err(|_| Error::Closed)
    }

    /// Queues a step; `Err(Closed)` once the store is closed.
    pub fn step(&self, step: Step) -> Result<()> {
        self.send(Message::Step(step)).map_err(|_| Error::Closed)
    }

    pub fn reset_all(&self, done: ResetDone) {
        let deadline = Instant::now() + self.timeout;
        if let Err(Message::ResetAll(done, _)) = self.send(Message::ResetAll(done, deadline)) {
            done(Err(Error::Closed));
        }
    }

    /// Refuses later calls; the thread ends once the queued ones are done.
    pub fn close(&self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// `BEGIN IMMEDIATE` (the write lock at once), as a cached statement: a
/// batch of SQL text would be parsed again on every call.
fn begin_immediate(conn: &Connection) -> rusqlite::Result<()> {
    conn.prepare_cached("BEGIN IMMEDIATE")?
        .execute([])
        .map(drop)
}

/// `COMMIT`, as a cached statement.
fn commit(conn: &Connection) -> rusqlite::Result<()> {
    conn.prepare_cached("COMMIT")?.execute([]).map(drop)
}

/// SQLite's WAL hook: after each commit, the WAL's size in frames (pages),
/// the figure SQLite's own automatic checkpoint goes by, kept in the
/// worker's counter `ctx`.
unsafe extern "C" fn wal_frames(
    ctx: *mut c_void,
    _db: *mut rusqlite::ffi::sqlite3,
    _name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `ctx` is the worker's boxed counter, which outlives the connection (see `open`).
    let counter = unsafe { &*(ctx as *const AtomicU64) };
    counter.store(u64::try_from(frames).unwrap_or(0), Ordering::Relaxed);
    rusqlite::ffi::SQLITE_OK
}

/// µs since the epoch on the host's wall clock.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A SQLite error as the store's, its text cleaned of the path. `sent`
/// false: the transaction was rolled back (or never began), so nothing of
/// it counted.
fn sqlite_error(e: &rusqlite::Error, path: &str) -> Error {
    let (code, text) = match e {
        rusqlite::Error::SqliteFailure(f, message) => {
            let detail = message.as_deref().unwrap_or("");
            let said = |what: &str| {
                format!(
                    "{what} (SQLite: {detail}; extended code {})",
                    f.extended_code
                )
            };
            match f.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => (
                    "ERR_TIMEOUT",
                    said("another connection kept the database file locked past timeoutMs (SQLITE_BUSY); the call counted nothing"),
                ),
                ErrorCode::ReadOnly => (
                    "ERR_SQLITE",
                    said("the database file, or its folder (where SQLite keeps the -wal and -shm files), is read-only (SQLITE_READONLY)"),
                ),
                ErrorCode::DiskFull => (
                    "ERR_SQLITE",
                    said("the disk holding the database file is full (SQLITE_FULL)"),
                ),
                ErrorCode::NotADatabase => (
                    "ERR_SQLITE",
                    said("the file at path is not a SQLite database (SQLITE_NOTADB)"),
                ),
                ErrorCode::DatabaseCorrupt => (
                    "ERR_SQLITE",
                    said("the database file is corrupt (SQLITE_CORRUPT)"),
                ),
                ErrorCode::CannotOpen => (
                    "ERR_SQLITE",
                    said("the database file can't be opened (SQLITE_CANTOPEN: its folder is missing, or the file or its folder is read-only)"),
                ),
                ErrorCode::PermissionDenied => (
                    "ERR_SQLITE",
                    said("the database file may not be opened by this process (SQLITE_PERM)"),
                ),
                ErrorCode::SystemIoFailure => (
                    "ERR_SQLITE",
                    said("reading or writing the database file failed (SQLITE_IOERR)"),
                ),
                _ => ("ERR_SQLITE", said("SQLite failed")),
            }
        }
        other => ("ERR_SQLITE", format!("SQLite failed: {other}")),
    };
    Error::Sql {
        store: Backend::Sqlite,
        code,
        text,
        sent: Some(false),
    }
    .redacted(&[path.as_bytes()])
}

fn foreign_table() -> Error {
    Error::Sql {
        store: Backend::Sqlite,
        code: "ERR_SQLITE",
        text: format!(
            "the file at path has a table {TABLE} that is not ratestore's (its columns differ); use another path"
        ),
        sent: Some(false),
    }
}

const SQL_CREATE: &str = "CREATE TABLE IF NOT EXISTS ratestore_counters (
  kind INTEGER NOT NULL, key BLOB NOT NULL, a INTEGER NOT NULL, b INTEGER NOT NULL,
  c INTEGER NOT NULL, ends_at INTEGER NOT NULL, PRIMARY KEY (kind, key)) WITHOUT ROWID";
const SQL_READ: &str =
    "SELECT a, b, c, ends_at FROM ratestore_counters WHERE kind = ?1 AND key = ?2";
const SQL_PUT: &str = "INSERT INTO ratestore_counters (kind, key, a, b, c, ends_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
  ON CONFLICT (kind, key) DO UPDATE SET a = excluded.a, b = excluded.b, c = excluded.c, ends_at = excluded.ends_at";
const SQL_DROP: &str = "DELETE FROM ratestore_counters WHERE kind = ?1 AND key = ?2";
/// The last key of the next sweep step's rows, after the cursor.
const SQL_SWEEP_END: &str = "SELECT kind, key FROM ratestore_counters WHERE (kind, key) > (?1, ?2)
  ORDER BY kind, key LIMIT 1 OFFSET ?3";
const SQL_SWEEP: &str =
    "DELETE FROM ratestore_counters WHERE (kind, key) > (?1, ?2) AND (kind, key) <= (?3, ?4)
  AND ends_at < ?5";
const SQL_SWEEP_REST: &str =
    "DELETE FROM ratestore_counters WHERE (kind, key) > (?1, ?2) AND ends_at < ?3";

/// A row's place in the table's key order: (kind, key).
type Cursor = (i64, Vec<u8>);

/// A row's key in a batch: (kind, key).
type RowKey<'k> = (u8, &'k [u8]);

/// The state of one key of a batch: its row as the batch has left it.
struct KeyRow {
    row: Option<Row>,
    changed: bool,
}

struct Worker {
    config: SqliteConfig,
    conn: Option<Connection>,
    delivery: Arc<Delivery>,
    counts: Arc<Counts>,
    /// The latest time a batch ran at: the clock never goes back within the store.
    last_now: u64,
    /// Where the sweep goes on from (kind, key), while one is under way.
    cursor: Option<Cursor>,
    /// The WAL's size in frames after the last commit (see `wal_frames`).
    /// After `conn`, so that it is dropped after the connection.
    wal_frames: Box<AtomicU64>,
}

/// The store's thread: runs what is queued, in batches, and the sweep and
/// the checkpoints between them.
fn serve(shared: &SqliteShared, receiver: &mpsc::Receiver<Message>, interval: Duration) {
    let mut next_sweep = Instant::now() + interval;
    loop {
        let sweeping = shared.lock().cursor.is_some();
        let wait = if interval.is_zero() {
            Duration::from_secs(3600)
        } else if sweeping {
            Duration::ZERO
        } else {
            next_sweep.saturating_duration_since(Instant::now())
        };
        let first = match receiver.recv_timeout(wait) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                if !interval.is_zero() {
                    let mut worker = shared.lock();
                    worker.sweep_step();
                    if worker.cursor.is_none() {
                        next_sweep = Instant::now() + interval;
                    }
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut worker = shared.lock();
        let mut taken = 0;
        let mut calls = Vec::new();
        let mut pending = Some(first);
        while let Some(message) = pending.take() {
            taken += 1;
            match message {
                Message::Call(call) => calls.push(SqliteWork::Call(call)),
                Message::Step(step) => calls.push(SqliteWork::Step(step)),
                Message::ResetAll(done, deadline) => {
                    // Calls made before it run before it.
                    worker.run(std::mem::take(&mut calls));
                    let result = worker.reset_all(deadline);
                    done(result);
                }
                Message::Checkpoint => {}
            }
            if calls.len() < MAX_BATCH {
                pending = receiver.try_recv().ok();
            }
        }
        worker.run(calls);
        worker.checkpoint_if_due();
        // Only now, with the worker still held, may a call run on its caller's thread again.
        shared.queued.fetch_sub(taken, Ordering::AcqRel);
    }
    // Closed, and every queued call run: the file is closed now, not when the store is collected.
    shared.lock().conn = None;
}

impl Worker {
    /// The connection, opened (and the table created) if need be.
    fn open(&mut self) -> Result<&Connection> {
        if self.conn.is_none() {
            let path = &self.config.path;
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let fail = |e: rusqlite::Error| sqlite_error(&e, path);
            let conn = Connection::open_with_flags(path, flags).map_err(fail)?;
            conn.busy_timeout(Duration::from_millis(self.config.timeout_ms))
                .map_err(fail)?;
            conn.set_prepared_statement_cache_capacity(16);
            // ':memory:' answers "memory": a database of this connection alone.
            let _mode: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .map_err(fail)?;
            let sync = match self.config.synchronous {
                Synchronous::Normal => "PRAGMA synchronous = NORMAL",
                Synchronous::Full => "PRAGMA synchronous = FULL",
            };
            conn.execute_batch(sync).map_err(fail)?;
            // The store's thread checkpoints instead (see CHECKPOINT_AFTER), going by the WAL's size,
            // which this hook keeps in `wal_frames` (it replaces SQLite's automatic checkpoint).
            // SAFETY: the handle of a live connection; the counter is boxed, so its address holds, and
            // the worker drops it after the connection (the fields' order), so the hook never sees it freed.
            unsafe {
                rusqlite::ffi::sqlite3_wal_hook(
                    conn.handle(),
                    Some(wal_frames),
                    std::ptr::from_ref::<AtomicU64>(&*self.wal_frames)
                        .cast_mut()
                        .cast(),
                );
            }
            conn.execute_batch(SQL_CREATE).map_err(fail)?;
            for sql in [SQL_READ, SQL_PUT, SQL_DROP] {
                if let Err(e) = conn.prepare_cached(sql) {
                    // A missing column: the table is someone else's.
                    return Err(match &e {
                        rusqlite::Error::SqlInputError { .. } => foreign_table(),
                        rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::Unknown => {
                            foreign_table()
                        }
                        _ => fail(e),
                    });
                }
            }
            self.conn = Some(conn);
        }
        Ok(self.conn.as_ref().expect("opened above"))
    }

    /// Drops a connection whose file failed in a way a new one may not
    /// (corrupt, replaced, read-only): the next call opens the file again.
    fn forget_if_broken(&mut self, e: &Error) {
        if matches!(
            e,
            Error::Sql {
                store: Backend::Sqlite,
                code: "ERR_SQLITE",
                ..
            }
        ) {
            self.conn = None;
        }
    }

    fn now(&mut self) -> u64 {
        self.last_now = self.last_now.max(wall_us());
        self.last_now
    }

    /// Begins a write transaction, waiting for another connection's lock up
    /// to `deadline`.
    fn begin(&mut self, deadline: Instant) -> Result<()> {
        let path = self.config.path.clone();
        let conn = self.open()?;
        let left = deadline.saturating_duration_since(Instant::now());
        let fail = |e: rusqlite::Error| sqlite_error(&e, &path);
        conn.busy_timeout(left.max(Duration::from_millis(1)))
            .map_err(fail)?;
        match begin_immediate(conn) {
            Ok(()) => Ok(()),
            Err(e) => Err(fail(e)),
        }
    }

    fn rollback(&mut self) {
        if let Some(conn) = &self.conn {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
    }

    fn commit(&mut self) -> Result<()> {
        let path = self.config.path.clone();
        let conn = self.conn.as_ref().ok_or(Error::Internal("no connection"))?;
        commit(conn).map_err(|e| sqlite_error(&e, &path))?;
        self.counts.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the WAL has grown enough for a checkpoint; a call on its
    /// caller's thread then asks the store's thread for one (once: the
    /// message queued keeps every call off the caller's thread until the
    /// thread has run it).
    fn checkpoint_due(&self) -> bool {
        self.wal_frames.load(Ordering::Relaxed) >= CHECKPOINT_AFTER
    }

    /// Copies the WAL into the file once it has grown by CHECKPOINT_AFTER
    /// pages, as SQLite's automatic checkpoint would in the commit that
    /// crossed it: on the store's thread, holding the connection, so that no
    /// write comes between and the WAL starts over from its beginning (a
    /// checkpoint on a second connection, racing the writes, may never
    /// catch up, and the WAL then grows without end). The calls made
    /// meanwhile queue for the thread's next transaction.
    fn checkpoint_if_due(&mut self) {
        if !self.checkpoint_due() {
            return;
        }
        // The next commit starts the WAL over, and says its size afresh.
        self.wal_frames.store(0, Ordering::Relaxed);
        if let Some(conn) = &self.conn {
            // One that can't run now (another connection's checkpoint) is tried again after the next writes.
            let _ = conn
                .busy_timeout(Duration::ZERO)
                .and_then(|()| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())));
        }
    }

    /// Runs one call at once on the caller's thread, in a transaction of its
    /// own, if the file's write lock is free now: never waits. A store whose
    /// file is not open yet (its first call opens it, creating the table)
    /// sends the call to its thread instead.
    fn inline(&mut self, call: Call) -> Inline {
        let Some(conn) = &self.conn else {
            return Inline::Queue(call);
        };
        let begun = conn
            .busy_timeout(Duration::ZERO)
            .and_then(|()| begin_immediate(conn));
        match begun {
            Ok(()) => {}
            Err(rusqlite::Error::SqliteFailure(f, _))
                if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) =>
            {
                return Inline::Queue(call);
            }
            Err(e) => {
                let e = sqlite_error(&e, &self.config.path);
                self.forget_if_broken(&e);
                return Inline::Failed(Completion {
                    id: call.id,
                    result: Err(e),
                });
            }
        }
        let id = call.id;
        let items = [SqliteWork::Call(call)];
        let answered = self.transact(&items);
        let mut answers = match answered {
            Ok(answers) => answers,
            Err(e) => {
                self.rollback();
                self.forget_if_broken(&e);
                return Inline::Failed(Completion { id, result: Err(e) });
            }
        };
        match answers.pop() {
            Some(Completion {
                result: Ok(answer), ..
            }) => Inline::Answered(answer),
            Some(failed) => Inline::Failed(failed),
            None => Inline::Failed(Completion {
                id,
                result: Err(Error::Internal("a call had no answer")),
            }),
        }
    }

    /// Runs a batch of calls in one transaction, and delivers their answers
    /// once it has committed.
    fn run(&mut self, mut calls: Vec<SqliteWork>) {
        if calls.is_empty() {
            return;
        }
        let mut done: Vec<Completion> = Vec::with_capacity(calls.len());
        let mut waited = false;
        let failed = |done: &mut Vec<Completion>, items: &mut Vec<SqliteWork>, e: &Error| {
            for item in items.drain(..) {
                done.extend(item.ids().into_iter().map(|id| Completion {
                    id,
                    result: Err(e.clone()),
                }));
            }
        };
        loop {
            // Calls whose time ran out (waiting for a lock) reject unsent.
            let now = Instant::now();
            let timed_out = self.timed_out();
            calls.retain(|c| {
                let alive = c.deadline() > now;
                if !alive {
                    done.extend(c.ids().into_iter().map(|id| Completion {
                        id,
                        result: Err(timed_out.clone()),
                    }));
                }
                alive
            });
            if calls.is_empty() {
                break;
            }
            let deadline = calls
                .iter()
                .map(SqliteWork::deadline)
                .min()
                .expect("not empty");
            match self.begin(deadline) {
                Ok(()) => {}
                Err(Error::Sql {
                    store: Backend::Sqlite,
                    code: "ERR_TIMEOUT",
                    ..
                }) if calls.iter().any(|c| c.deadline() > deadline) => {
                    // The earliest ran out: the others wait on.
                    waited = true;
                    continue;
                }
                Err(e) => {
                    self.forget_if_broken(&e);
                    failed(&mut done, &mut calls, &e);
                    break;
                }
            }
            match self.transact(&calls) {
                Ok(answers) => {
                    if waited {
                        self.counts.busy_waits.fetch_add(1, Ordering::Relaxed);
                    }
                    done.extend(answers);
                }
                Err(e) => {
                    self.rollback();
                    self.forget_if_broken(&e);
                    failed(&mut done, &mut calls, &e);
                }
            }
            break;
        }
        self.delivery.push_all(done);
    }

    fn timed_out(&self) -> Error {
        Error::Sql {
            store: Backend::Sqlite,
            code: "ERR_TIMEOUT",
            text: format!(
                "another connection kept the database file locked for {} ms (timeoutMs) (SQLITE_BUSY); \
                 the call counted nothing",
                self.config.timeout_ms
            ),
            sent: Some(false),
        }
    }

    /// The batch's calls inside the open transaction, then COMMIT. Each
    /// key's row is read once and written once, however many calls it has.
    /// A step's takes are computed on the rows as the batch has left them,
    /// and written only when every take allows.
    fn transact(&mut self, calls: &[SqliteWork]) -> Result<Vec<Completion>> {
        let now = self.now();
        let path = self.config.path.clone();
        let fail = |e: rusqlite::Error| sqlite_error(&e, &path);
        let conn = self.conn.as_ref().ok_or(Error::Internal("no connection"))?;
        let mut slots: HashMap<(u8, &[u8]), KeyRow> = HashMap::new();
        let mut answers = Vec::with_capacity(calls.len());
        {
            let mut read = conn.prepare_cached(SQL_READ).map_err(fail)?;
            let mut load = |kind: u8, key: &[u8]| -> Result<Option<Row>> {
                let row = read
                    .query_row(params![kind, key], |r| {
                        Ok(Row {
                            a: r.get(0)?,
                            b: r.get(1)?,
                            c: r.get(2)?,
                            ends_at: r.get::<_, i64>(3)?.max(0) as u64,
                        })
                    })
                    .optional()
                    .map_err(fail)?;
                Ok(row)
            };
            for item in calls {
                let call = match item {
                    SqliteWork::Call(call) => call,
                    SqliteWork::Step(step) => {
                        answers.extend(Self::step(&mut slots, &mut load, step, now)?);
                        continue;
                    }
                };
                if call.op == Op::Ping {
                    answers.push(Completion {
                        id: call.id,
                        result: Ok(Answer::new(&[1])),
                    });
                    continue;
                }
                let kind = apply::kind(call.op, &call.args);
                if !slots.contains_key(&(kind, call.key.as_slice())) {
                    let row = load(kind, &call.key)?;
                    slots.insert(
                        (kind, &call.key),
                        KeyRow {
                            row,
                            changed: false,
                        },
                    );
                }
                let slot = slots
                    .get_mut(&(kind, call.key.as_slice()))
                    .expect("inserted above");
                let stored = slot.row.filter(|r| apply::live(kind, r, now));
                let result =
                    apply::apply(call.op, &call.args, stored, now).map(|(answer, write)| {
                        match write {
                            RowWrite::Keep => {}
                            RowWrite::Put(row) => {
                                slot.row = Some(row);
                                slot.changed = true;
                            }
                            RowWrite::Drop => {
                                slot.changed |= slot.row.is_some();
                                slot.row = None;
                            }
                        }
                        answer
                    });
                answers.push(Completion {
                    id: call.id,
                    result,
                });
            }
        }
        {
            let mut put = conn.prepare_cached(SQL_PUT).map_err(fail)?;
            let mut drop = conn.prepare_cached(SQL_DROP).map_err(fail)?;
            for ((kind, key), slot) in slots.iter().filter(|(_, s)| s.changed) {
                match slot.row {
                    Some(r) => put.execute(params![
                        kind,
                        key,
                        r.a,
                        r.b,
                        r.c,
                        apply::column_time(r.ends_at)
                    ]),
                    None => drop.execute(params![kind, key]),
                }
                .map_err(fail)?;
            }
        }
        self.commit()?;
        Ok(answers)
    }

    /// One step's takes on the batch's rows: each computed on its key's row
    /// as the batch (and the step's earlier takes) left it; when every take
    /// allows, their writes are made, else none is (the answers then say
    /// what each take found). An error fails the step alone, changing
    /// nothing; only an error reading a row fails the batch.
    fn step<'k>(
        slots: &mut HashMap<(u8, &'k [u8]), KeyRow>,
        load: &mut impl FnMut(u8, &[u8]) -> Result<Option<Row>>,
        step: &'k Step,
        now: u64,
    ) -> Result<Vec<Completion>> {
        // The rows as the step would leave them: (kind, key) -> (row, changed).
        let mut scratch: Vec<(RowKey<'k>, Option<Row>, bool)> = Vec::new();
        let mut answers = Vec::with_capacity(step.takes.len());
        let mut outcome = Ok(());
        for take in &step.takes {
            let kind = apply::kind(take.op, &take.args);
            let at = match scratch
                .iter()
                .position(|(k, _, _)| *k == (kind, &take.key[..]))
            {
                Some(at) => at,
                None => {
                    let row = match slots.get(&(kind, &take.key[..])) {
                        Some(slot) => slot.row,
                        None => load(kind, &take.key)?,
                    };
                    scratch.push(((kind, &take.key), row, false));
                    scratch.len() - 1
                }
            };
            let (_, row, changed) = &mut scratch[at];
            let stored = row.filter(|r| apply::live(kind, r, now));
            match apply::apply(take.op, &take.args, stored, now) {
                Ok((answer, write)) => {
                    match write {
                        RowWrite::Keep => {}
                        RowWrite::Put(r) => {
                            *row = Some(r);
                            *changed = true;
                        }
                        RowWrite::Drop => {
                            *changed |= row.is_some();
                            *row = None;
                        }
                    }
                    answers.push(answer);
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        let ids = step.takes.iter().map(|t| t.id);
        if let Err(e) = outcome {
            return Ok(ids
                .map(|id| Completion {
                    id,
                    result: Err(e.clone()),
                })
                .collect());
        }
        if answers.iter().all(|a| a.values[0] == 1) {
            for (key, row, changed) in scratch {
                let slot = slots.entry(key).or_insert(KeyRow {
                    row,
                    changed: false,
                });
                if changed {
                    slot.row = row;
                    slot.changed = true;
                }
            }
        }
        Ok(ids
            .zip(answers)
            .map(|(id, answer)| Completion {
                id,
                result: Ok(answer),
            })
            .collect())
    }

    fn reset_all(&mut self, deadline: Instant) -> Result<()> {
        self.begin(deadline)
            .inspect_err(|e| self.forget_if_broken(e))?;
        let path = self.config.path.clone();
        let conn = self.conn.as_ref().ok_or(Error::Internal("no connection"))?;
        let result = conn
            .execute("DELETE FROM ratestore_counters", [])
            .map_err(|e| sqlite_error(&e, &path));
        match result.and_then(|_| self.commit()) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.rollback();
                self.forget_if_broken(&e);
                Err(e)
            }
        }
    }

    /// One step of the sweep: the expired rows among the next
    /// [`SWEEP_BATCH`] after the cursor, deleted in one short transaction
    /// (one that finds the file locked gives up at once, to try again on the
    /// next round). Only while the store has its connection open.
    fn sweep_step(&mut self) {
        if self.conn.is_none() {
            return;
        }
        let (kind, key) = self.cursor.take().unwrap_or((-1, Vec::new()));
        let now = self.now();
        // Rows past their end by more than a ms count nothing, whatever their kind.
        let before = apply::column_time(now.saturating_sub(1000));
        let conn = self.conn.as_ref().expect("checked above");
        let _ = conn.busy_timeout(Duration::ZERO);
        let step = (|| -> rusqlite::Result<(usize, Option<Cursor>)> {
            begin_immediate(conn)?;
            let end: Option<Cursor> = conn
                .prepare_cached(SQL_SWEEP_END)?
                .query_row(params![kind, key, SWEEP_BATCH - 1], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let deleted = match &end {
                Some((end_kind, end_key)) => conn
                    .prepare_cached(SQL_SWEEP)?
                    .execute(params![kind, key, end_kind, end_key, before])?,
                None => conn
                    .prepare_cached(SQL_SWEEP_REST)?
                    .execute(params![kind, key, before])?,
            };
            commit(conn)?;
            Ok((deleted, end))
        })();
        match step {
            Ok((deleted, end)) => {
                self.counts
                    .swept
                    .fetch_add(deleted as u64, Ordering::Relaxed);
                self.cursor = end;
            }
            Err(_) => self.rollback(),
        }
    }
}
