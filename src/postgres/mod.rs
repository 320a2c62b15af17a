//! postgresStore's core: the fixed window in seed 000's table (`key text
//! PRIMARY KEY, total bigint, reset_at timestamptz`), one statement per hit,
//! on the database's clock (`now()`), run on the shared I/O thread.
//!
//! Every statement goes out unnamed (`query_typed`: Parse, Bind, Execute in
//! one round trip, no prepared statement kept), so nothing depends on the
//! session and the store works through PgBouncer's transaction mode.
//! Concurrent calls share one connection, in one queue: the calls made while
//! a statement is on the way go out together as one statement ([`queue`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

use crate::errors::{Error, Result};
use crate::ops::{Answer, Args, Op};
use crate::redis::health::{Backoff, Gate, TIMEOUTS_BEFORE_REPLACING};
use crate::window::MAX_SAFE;

mod queue;
pub mod schema;
mod tls;
use queue::{Encoded, Kind, Work};
use schema::Names;
use tls::{SslMode, Tls};

/// The environment variables read for the URL, in order.
pub const URL_VARIABLES: [&str; 2] = ["DATABASE_URL", "POSTGRES_URL"];
pub const DEFAULT_TABLE: &str = "askdare_counters";
pub const DEFAULT_TIMEOUT_MS: u64 = 2000;
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;

/// The options as JavaScript gave them (checked there).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub url: Option<String>,
    pub table: Option<String>,
    pub schema: Option<String>,
    pub timeout_ms: Option<u64>,
    pub create_table: Option<bool>,
    /// `sslmode`, overriding the URL's.
    pub sslmode: Option<String>,
    /// `tls.ca`: PEM certificates to trust instead of the public roots.
    pub tls_ca: Option<String>,
    /// `sweepIntervalMs`: 0 turns the sweeper off.
    pub sweep_interval_ms: Option<u64>,
}

/// The settings, resolved against the environment.
#[derive(Clone)]
pub struct Config {
    pg: tokio_postgres::Config,
    /// The password, kept to clean it out of any message.
    password: Vec<u8>,
    url: String,
    /// The tables' and functions' names, quoted.
    names: Names,
    pub timeout_ms: u64,
    create_table: bool,
    /// TLS, unless `sslmode` is `disable`.
    tls: Option<Tls>,
    sweep_interval_ms: u64,
}

fn config_error(text: impl Into<String>) -> Error {
    Error::Postgres {
        code: "ERR_CONFIG",
        text: text.into(),
        sent: None,
    }
}

impl Config {
    /// Resolves `options` against the environment that `env` reads.
    pub fn resolve(options: &Options, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let url = match &options.url {
            Some(url) => url.clone(),
            None => URL_VARIABLES
                .iter()
                .find_map(|name| env(name))
                .ok_or_else(|| {
                    config_error(
                        "no database URL: pass { url } or set DATABASE_URL (or POSTGRES_URL)",
                    )
                })?,
        };
        let (rest, url_mode, root) = tls::split_url(&url);
        let mut pg: tokio_postgres::Config = rest.parse().map_err(|_| {
            config_error("the database URL can't be parsed (expected postgres://user:password@host:port/database)")
        })?;
        let password = pg.get_password().map(<[u8]>::to_vec).unwrap_or_default();
        let system_roots = match root.as_deref() {
            None => false,
            Some("system") => true,
            Some(_) => {
                return Err(config_error(
                    "sslrootcert names a file, which postgresStore does not read: pass the CA's PEM as tls.ca \
                     (sslrootcert=system uses the public roots)",
                ))
            }
        };
        let mode = match options.sslmode.as_deref().or(url_mode.as_deref()) {
            Some(text) => SslMode::parse(text)?,
            None if system_roots => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if system_roots && !matches!(mode, SslMode::VerifyFull | SslMode::VerifyCa) {
            return Err(config_error(
                "sslrootcert=system checks the server's certificate: use sslmode=verify-full (or verify-ca)",
            ));
        }
        let ca = options
            .tls_ca
            .as_deref()
            .map(tls::certificates)
            .transpose()?;
        let tls = match mode {
            SslMode::Disable if ca.is_some() => {
                return Err(config_error(
                    "tls.ca is set but sslmode is disable; TLS is used with the other modes",
                ))
            }
            SslMode::Disable => None,
            _ => Some(Tls::new(mode, ca.as_deref())?),
        };
        pg.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let names = Names::new(
            options.table.as_deref().unwrap_or(DEFAULT_TABLE),
            options.schema.as_deref(),
        )?;
        Ok(Config {
            pg,
            password,
            url,
            names,
            timeout_ms: options.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            create_table: options.create_table.unwrap_or(true),
            tls,
            sweep_interval_ms: options
                .sweep_interval_ms
                .unwrap_or(DEFAULT_SWEEP_INTERVAL_MS),
        })
    }

    fn secrets(&self) -> [&[u8]; 2] {
        [&self.password, self.url.as_bytes()]
    }
}

/// The statements, for one set of names. Each operation is one call of the
/// algorithm's PL/pgSQL function (src/postgres/schema.rs), whose statements
/// PostgreSQL plans once per session: the client sends one short statement.
struct Sql {
    create: String,
    fixed: String,
    sliding: String,
    bucket: String,
    /// One statement for a batch of calls, by the set of algorithms in it
    /// (bit 0 the fixed window, 1 the sliding window, 2 the bucket): a
    /// database with only some functions (createTable: false) runs the
    /// batches that name only those.
    batch: [String; 8],
    unlink: [String; 3],
    reset_all: [String; 3],
    sweep: [String; 3],
}

impl Sql {
    fn new(n: &Names) -> Sql {
        Sql {
            create: schema::create_batch(n),
            fixed: format!("SELECT {}($1, $2, $3, $4, $5)", n.fixed_fn),
            sliding: format!("SELECT {}($1, $2, $3, $4, $5)", n.sliding_fn),
            bucket: format!("SELECT {}($1, $2, $3, $4, $5)", n.bucket_fn),
            batch: std::array::from_fn(|kinds| batch_sql(n, kinds)),
            unlink: [&n.table, &n.sliding, &n.bucket]
                .map(|t| format!("DELETE FROM {t} WHERE key = $1")),
            reset_all: [&n.table, &n.sliding, &n.bucket].map(|t| format!("DELETE FROM {t}")),
            // Rows that count nothing: an ended window, a sliding state past its
            // end, a bucket full again. SKIP LOCKED: a row a call holds is left.
            sweep: [
                (&n.table, "reset_at"),
                (&n.sliding, "expires_at"),
                (&n.bucket, "expires_at"),
            ]
            .map(|(t, column)| {
                format!(
                    "DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t} WHERE {column} < now() \
                     LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED))"
                )
            }),
        }
    }
}

/// The statement for a batch of calls of the algorithms in `kinds` (bit
/// [`Kind`]): each row of `unnest` one call, answered in the order of the rows.
fn batch_sql(n: &Names, kinds: usize) -> String {
    let call = |kind: Kind| match kind {
        Kind::Fixed => format!("{}(u.o, u.k, u.a, u.b, u.c)", n.fixed_fn),
        Kind::Sliding => format!("{}(u.o, u.k, u.a, u.b, u.c)", n.sliding_fn),
        Kind::Bucket => format!("{}(u.k, u.a, u.b, u.c, u.d)", n.bucket_fn),
    };
    let present: Vec<Kind> = [Kind::Fixed, Kind::Sliding, Kind::Bucket]
        .into_iter()
        .filter(|&kind| kinds & (1 << kind as usize) != 0)
        .collect();
    let value = match present.as_slice() {
        [] => "NULL::int8[]".to_string(),
        [one] => call(*one),
        many => {
            let arms: Vec<String> = many
                .iter()
                .map(|&kind| format!(" WHEN {} THEN {}", kind as i32, call(kind)))
                .collect();
            format!("CASE u.f{} END", arms.concat())
        }
    };
    format!(
        "SELECT {value} FROM unnest($1::int4[], $2::int4[], $3::text[], $4::int8[], $5::int8[], $6::int8[], \
         $7::int8[]) WITH ORDINALITY AS u(f, o, k, a, b, c, d, i) ORDER BY u.i"
    )
}

/// An algorithm function's answer, `len` safe integers, checked.
fn answer(values: Option<Vec<i64>>, len: usize) -> Result<Answer> {
    match values {
        Some(v) if v.len() == len && v.iter().all(|n| n.abs() <= MAX_SAFE) => Ok(Answer::new(&v)),
        _ => Err(schema::wrong_shape()),
    }
}

/// One store's connection and statements.
pub struct PgStore {
    config: Config,
    sql: Sql,
    client: Mutex<Option<Arc<Client>>>,
    /// The calls waiting for the connection, in the order they were made.
    queue: std::sync::Mutex<queue::Queue>,
    /// Set by a 25006 answer, or by [`TIMEOUTS_BEFORE_REPLACING`] statements
    /// in a row that timed out: the next call replaces the connection.
    replace: AtomicBool,
    /// Statements in a row that got no answer within `timeoutMs`.
    timeouts: std::sync::atomic::AtomicU32,
    /// Spaces out connects after failures.
    backoff: std::sync::Mutex<Backoff>,
    /// Expired rows the sweeper removed: `stats().swept`.
    swept: Arc<AtomicU64>,
    closed: AtomicBool,
}

/// Rows one sweep statement removes at most: each holds its rows' locks
/// for one short statement, and skips rows a call has locked.
const SWEEP_BATCH: u64 = 500;
/// The pause between two batches of one sweep, so that hits pipelined on
/// the connection go between them.
const SWEEP_PAUSE: Duration = Duration::from_millis(20);

/// A tokio-postgres error as a core error, its text cleaned of `secrets`.
fn pg_error(e: tokio_postgres::Error, secrets: &[&[u8]]) -> Error {
    let (code, text) = match e.as_db_error() {
        Some(db) if db.code().code() == schema::COUNT_RANGE_STATE => return Error::CountOutOfRange,
        // statement_timeout (or a cancel): the statement was rolled back, so the call counted nothing.
        Some(db) if db.code().code() == "57014" => {
            return Error::Postgres {
                code: "ERR_TIMEOUT",
                text: format!(
                    "PostgreSQL cancelled the statement (57014: {}); it was rolled back: the call was sent, \
                     counted nothing, and is not sent again",
                    db.message()
                ),
                sent: Some(true),
            }
            .redacted(secrets)
        }
        Some(db) => {
            let state = db.code().code();
            let code = match state {
                "28P01" | "28000" => "ERR_AUTH",
                _ => "ERR_POSTGRES",
            };
            let hint = match state {
                "42P01" => " (the table is missing: create it with docs/postgres.sql, or leave createTable on)",
                "42883" => " (the store's function is missing: create it with docs/postgres.sql, or leave createTable on)",
                "25006" => " (the server is read-only, e.g. a standby after a failover: the next call connects again)",
                _ => "",
            };
            (
                code,
                format!("PostgreSQL answered {state}: {}{hint}", db.message()),
            )
        }
        // No answer from the server: the connection failed or was lost.
        None => {
            // tokio-postgres's text names the stage; its sources say why (a TLS check, a refused connect).
            let mut text = format!("the connection to PostgreSQL failed: {e}");
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            ("ERR_CONNECTION", text)
        }
    };
    Error::Postgres {
        code,
        text,
        sent: None,
    }
    .redacted(secrets)
}

/// A connect in progress; dropped before it finished (its call timed out),
/// it is a failed connect for the backoff.
struct Attempt<'a> {
    store: &'a PgStore,
    done: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            let e = queue::timeout_error(self.store.config.timeout_ms);
            self.store
                .backoff()
                .failed(Instant::now(), queue::with_sent(e, false));
        }
    }
}

/// Whether `e` is PostgreSQL's "read-only SQL transaction" (25006): the
/// connection reaches a server that can't write, such as a primary demoted
/// by a failover, so the next call connects anew (the URL's host may now
/// name the new primary).
fn read_only(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == "25006")
}

/// Whether `e` is PostgreSQL's "relation does not exist".
fn undefined_table(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == "42P01")
}

impl PgStore {
    /// A statement got no answer within `timeoutMs` (`answered`: false) or
    /// got one. A connection on which [`TIMEOUTS_BEFORE_REPLACING`] in a row
    /// got none (a backend or a network path that hangs) is replaced on the
    /// next call; what it had sent may still run there.
    fn answered(&self, answered: bool) {
        if answered {
            self.timeouts.store(0, Ordering::Relaxed);
        } else if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_BEFORE_REPLACING {
            self.timeouts.store(0, Ordering::Relaxed);
            self.replace.store(true, Ordering::Relaxed);
        }
    }

    pub fn new(config: Config, swept: Arc<AtomicU64>) -> PgStore {
        let sql = Sql::new(&config.names);
        PgStore {
            config,
            sql,
            client: Mutex::new(None),
            queue: std::sync::Mutex::new(queue::Queue::default()),
            replace: AtomicBool::new(false),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            backoff: std::sync::Mutex::new(Backoff::new(
                u64::from(std::process::id()) ^ (Arc::as_ptr(&swept) as u64),
            )),
            swept,
            closed: AtomicBool::new(false),
        }
    }

    /// Starts the sweeper (unless `sweepIntervalMs` is 0): every interval,
    /// while the store is open and connected, it deletes expired rows in
    /// batches. It never connects on its own, and ends with the store.
    pub fn start_sweeper(store: &Arc<PgStore>, handle: &tokio::runtime::Handle) {
        let every = store.config.sweep_interval_ms;
        if every == 0 {
            return;
        }
        let weak = Arc::downgrade(store);
        handle.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(every)).await;
                let Some(store) = weak.upgrade() else { return };
                if store.closed.load(Ordering::Relaxed) {
                    return;
                }
                // A failed sweep (the connection lost, the server busy) waits for the next interval.
                let _ = store.sweep().await;
            }
        });
    }

    /// One sweep of the three tables; answers the rows it removed.
    pub async fn sweep(&self) -> Result<u64> {
        let client = match &*self.client.lock().await {
            Some(client) if !client.is_closed() => Arc::clone(client),
            _ => return Ok(0),
        };
        let mut removed = 0;
        for (state, sql) in self.sql.sweep.iter().enumerate() {
            loop {
                let work = client.execute_typed(sql, &[]);
                let n =
                    match tokio::time::timeout(Duration::from_millis(self.config.timeout_ms), work)
                        .await
                    {
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) if state > 0 && undefined_table(&e) => break,
                        Ok(Err(e)) => return Err(self.error(e)),
                        Err(_) => return Ok(removed),
                    };
                removed += n;
                self.swept.fetch_add(n, Ordering::Relaxed);
                if n < SWEEP_BATCH || self.closed.load(Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(SWEEP_PAUSE).await;
            }
        }
        Ok(removed)
    }

    pub fn timeout_ms(&self) -> u64 {
        self.config.timeout_ms
    }

    fn error(&self, e: tokio_postgres::Error) -> Error {
        if read_only(&e) {
            self.replace.store(true, Ordering::Relaxed);
        }
        pg_error(e, &self.config.secrets())
    }

    /// The open connection, connecting (and creating the table) first if
    /// there is none or it was lost. One connect at a time: the lock.
    ///
    /// After a failed connect, calls reject at once (unsent) for a delay
    /// that doubles with each failure in a row ([`Backoff`]); then the next
    /// call alone connects (the others, waiting on the lock, see its outcome).
    async fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if self.replace.swap(false, Ordering::Relaxed) {
            slot.take();
        }
        if let Some(client) = &*slot {
            if !client.is_closed() {
                return Ok(Arc::clone(client));
            }
        }
        if let Gate::Refuse(e) = self.backoff().gate(Instant::now()) {
            return Err(e);
        }
        // Dropped unfinished (the call's timeoutMs passed), the connect counts as failed.
        let mut attempt = Attempt {
            store: self,
            done: false,
        };
        let result = self.connect().await;
        attempt.done = true;
        match result {
            Ok(client) => {
                self.backoff().succeeded();
                let client = Arc::new(client);
                *slot = Some(Arc::clone(&client));
                Ok(client)
            }
            Err(e) => {
                // The calls refused meanwhile report it as not sent.
                self.backoff()
                    .failed(Instant::now(), queue::with_sent(e.clone(), false));
                Err(e)
            }
        }
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection, with the store's tables and functions made on it.
    async fn connect(&self) -> Result<Client> {
        let client = match &self.config.tls {
            None => {
                let (client, connection) = self
                    .config
                    .pg
                    .connect(NoTls)
                    .await
                    .map_err(|e| self.error(e))?;
                tokio::spawn(connection);
                client
            }
            Some(tls) => {
                let (client, connection) = self
                    .config
                    .pg
                    .connect(tls.clone())
                    .await
                    .map_err(|e| self.error(e))?;
                tokio::spawn(connection);
                client
            }
        };
        if self.config.create_table {
            client
                .batch_execute(&self.sql.create)
                .await
                .map_err(|e| self.error(e))?;
        }
        Ok(client)
    }

    /// Runs one op within the store's timeout, in its place in the store's queue.
    pub async fn run(self: &Arc<Self>, op: Op, args: Args, key: String) -> Result<Answer> {
        self.submit(Work::Call { op, args, key }).await
    }

    /// One call of an algorithm's function, alone.
    async fn function(&self, client: &Client, call: &Encoded<'_>) -> Result<Answer> {
        let sql = match call.kind {
            Kind::Fixed => &self.sql.fixed,
            Kind::Sliding => &self.sql.sliding,
            Kind::Bucket => &self.sql.bucket,
        };
        let params: [(&(dyn ToSql + Sync), Type); 5] = match call.kind {
            Kind::Fixed | Kind::Sliding => [
                (&call.op, Type::INT4),
                (&call.key, Type::TEXT),
                (&call.a, Type::INT8),
                (&call.b, Type::INT8),
                (&call.c, Type::INT8),
            ],
            Kind::Bucket => [
                (&call.key, Type::TEXT),
                (&call.a, Type::INT8),
                (&call.b, Type::INT8),
                (&call.c, Type::INT8),
                (&call.d, Type::INT8),
            ],
        };
        let rows = client
            .query_typed(sql, &params)
            .await
            .map_err(|e| self.error(e))?;
        answer(rows.first().and_then(|row| row.try_get(0).ok()), call.len)
    }

    async fn run_op(&self, client: &Client, op: Op, args: &Args, key: &str) -> Result<Answer> {
        if let Some(call) = Encoded::new(op, args, key) {
            return self.function(client, &call).await;
        }
        let k = || (&key as &(dyn ToSql + Sync), Type::TEXT);
        match op {
            Op::Unlink => {
                let state = args[0] as usize;
                match client.execute_typed(&self.sql.unlink[state], &[k()]).await {
                    Ok(n) => Ok(Answer::new(&[n as i64])),
                    // A state's table that was never created (createTable: false) holds nothing.
                    Err(e) if state > 0 && undefined_table(&e) => Ok(Answer::new(&[0])),
                    Err(e) => Err(self.error(e)),
                }
            }
            _ => {
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| self.error(e))?;
                Ok(Answer::new(&[1]))
            }
        }
    }

    /// Deletes every counter and state of the store's tables, in its place in the queue.
    pub async fn reset_all(self: &Arc<Self>) -> Result<()> {
        self.submit(Work::ResetAll).await.map(|_| ())
    }

    async fn reset_all_on(&self, client: &Client) -> Result<()> {
        for (state, sql) in self.sql.reset_all.iter().enumerate() {
            match client.batch_execute(sql).await {
                Ok(()) => {}
                Err(e) if state > 0 && undefined_table(&e) => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(())
    }

    /// Drops the connection (calls in flight fail).
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.client.lock().await.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_url_names_the_variables() {
        let err = Config::resolve(&Options::default(), |_| None)
            .err()
            .unwrap();
        assert_eq!(err.code(), "ERR_CONFIG");
        assert!(err.to_string().contains("DATABASE_URL"));
        assert!(err.to_string().contains("POSTGRES_URL"));
    }

    #[test]
    fn the_url_option_wins_then_database_url() {
        let env = |name: &str| (name == "POSTGRES_URL").then(|| "postgres://u@h:1/b".to_string());
        let config = Config::resolve(&Options::default(), env).ok().unwrap();
        assert_eq!(config.pg.get_dbname(), Some("b"));
        let both = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://u@h:1/first".to_string()),
            _ => Some("postgres://u@h:1/second".to_string()),
        };
        let config = Config::resolve(&Options::default(), both).ok().unwrap();
        assert_eq!(config.pg.get_dbname(), Some("first"));
    }

    #[test]
    fn names_are_quoted() {
        let options = Options {
            url: Some("postgres://u@h/b".into()),
            table: Some("we\"ird".into()),
            schema: Some("s".into()),
            ..Options::default()
        };
        let config = Config::resolve(&options, |_| None).ok().unwrap();
        assert_eq!(config.names.table, "\"s\".\"we\"\"ird\"");
    }
}
