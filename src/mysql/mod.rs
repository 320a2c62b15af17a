//! mysqlStore's core: counters in MySQL 8 or MariaDB 10.6+, one procedure
//! call per operation ([`schema`]), on the database's clock, run on the
//! shared I/O thread by a small protocol client of its own ([`proto`]).
//!
//! Calls go out in batches, one query of several statements (one round trip)
//! per batch, on up to `connections` connections at once ([`queue`]). Each
//! call is its own short transaction on its own key's row, so batches never
//! deadlock each other, and a call waits on a row another session holds
//! for at most the lock wait the procedure sets (`innodb_lock_wait_timeout`,
//! whole seconds) while the store's other connections serve other keys.
//! Nothing is kept on the session between queries, so the store works
//! through a pooler that does not keep session state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::errors::{Backend, Error, Result};
use crate::health::{Backoff, Gate};

pub mod codes;
mod proto;
mod queue;
pub mod schema;
mod step;
mod tls;

use proto::{Login, MyConn, MyFailure, TlsUse};
use schema::MyNames;
use tls::MySslMode;

pub use queue::MyWork;

/// The environment variables read for the URL, in order.
pub const URL_VARIABLES: [&str; 2] = ["DATABASE_URL", "MYSQL_URL"];
pub const DEFAULT_TABLE: &str = "askdare_counters";
pub const DEFAULT_TIMEOUT_MS: u64 = 2000;
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;
pub const DEFAULT_CONNECTIONS: usize = 4;
pub const MAX_CONNECTIONS: usize = 64;
/// URL parameters that other MySQL clients (Prisma, mysql2, PlanetScale's
/// drivers) put in their URLs and that mean nothing here: accepted and ignored.
pub const IGNORED_PARAMETERS: [&str; 8] = [
    "connection_limit",
    "pool_timeout",
    "connect_timeout",
    "socket_timeout",
    "charset",
    "timezone",
    "sslcert",
    "ssl_cert",
];

/// The options as JavaScript gave them (checked there).
#[derive(Clone, Debug, Default)]
pub struct MyOptions {
    pub url: Option<String>,
    pub table: Option<String>,
    pub timeout_ms: Option<u64>,
    pub create_table: Option<bool>,
    /// `sslMode`, overriding the URL's.
    pub ssl_mode: Option<String>,
    /// `tls.ca`: PEM certificates to trust instead of the public roots.
    pub tls_ca: Option<String>,
    /// `sweepIntervalMs`: 0 turns the sweeper off.
    pub sweep_interval_ms: Option<u64>,
    pub connections: Option<usize>,
}

pub(crate) fn config_error(text: impl Into<String>) -> Error {
    Error::Sql {
        store: Backend::Mysql,
        code: "ERR_CONFIG",
        text: text.into(),
        sent: None,
    }
}

/// The settings, resolved against the environment.
#[derive(Clone)]
pub struct MyConfig {
    target: Login,
    tls: TlsUse,
    url: String,
    names: MyNames,
    pub timeout_ms: u64,
    create_table: bool,
    sweep_interval_ms: u64,
    connections: usize,
    /// The lock wait a call accepts on its key's row, in whole seconds.
    lock_s: u64,
}

fn decode(part: &str) -> Result<String> {
    percent_encoding::percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            config_error("the database URL's user, password or database is not UTF-8 once decoded")
        })
}

impl MyConfig {
    /// Resolves `options` against the environment that `env` reads.
    pub fn resolve(options: &MyOptions, env: impl Fn(&str) -> Option<String>) -> Result<MyConfig> {
        let url = match &options.url {
            Some(url) => url.clone(),
            None => URL_VARIABLES
                .iter()
                .find_map(|name| env(name))
                .ok_or_else(|| {
                    config_error("no database URL: pass { url } or set DATABASE_URL (or MYSQL_URL)")
                })?,
        };
        let parsed = url::Url::parse(&url).map_err(|_| {
            config_error("the database URL can't be parsed (expected mysql://user:password@host:port/database)")
        })?;
        if !matches!(parsed.scheme(), "mysql" | "mariadb") {
            return Err(config_error(
                "the database URL must start with mysql:// (or mariadb://)",
            ));
        }
        let host = match parsed.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(config_error("the database URL names no host")),
        };
        let database = parsed.path().trim_start_matches('/');
        let database = (!database.is_empty())
            .then(|| decode(database))
            .transpose()?;
        let user = decode(parsed.username())?;
        let password = decode(parsed.password().unwrap_or(""))?;
        let mut mode = None;
        for (name, value) in parsed.query_pairs() {
            match name.as_ref() {
                "ssl-mode" | "sslmode" | "ssl_mode" => mode = Some(MySslMode::parse(&value)?),
                // mysql2's and PlanetScale's: ssl={"rejectUnauthorized":true}, or true / false.
                "ssl" => {
                    let v = value.replace(' ', "");
                    mode = Some(match v.as_str() {
                        "true" | "1" => MySslMode::Required,
                        "false" | "0" => MySslMode::Disabled,
                        _ if v.contains("\"rejectUnauthorized\":true") || v == "{}" => MySslMode::VerifyIdentity,
                        _ if v.contains("\"rejectUnauthorized\":false") => MySslMode::Required,
                        _ => return Err(config_error(
                            "the URL's ssl parameter must be true, false or {\"rejectUnauthorized\":true|false}",
                        )),
                    })
                }
                // Prisma's.
                "sslaccept" => {
                    mode = Some(match value.as_ref() {
                        "strict" => MySslMode::VerifyIdentity,
                        "accept_invalid_certs" => MySslMode::Required,
                        _ => {
                            return Err(config_error(
                                "the URL's sslaccept must be strict or accept_invalid_certs",
                            ))
                        }
                    })
                }
                known if IGNORED_PARAMETERS.contains(&known) => {}
                other => {
                    // The name only: a value may be a secret.
                    let shown: String = other.chars().take(40).collect();
                    return Err(config_error(format!(
                        "the database URL's parameter {shown:?} is not one mysqlStore knows (it reads ssl-mode, \
                         sslmode, ssl and sslaccept, and ignores {})",
                        IGNORED_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        if let Some(m) = options.ssl_mode.as_deref() {
            mode = Some(MySslMode::parse(m)?);
        }
        let mode = mode.unwrap_or(MySslMode::Preferred);
        let ca = options
            .tls_ca
            .as_deref()
            .map(tls::certificates)
            .transpose()?;
        let tls = match mode {
            MySslMode::Disabled if ca.is_some() => {
                return Err(config_error(
                    "tls.ca is set but ssl-mode is DISABLED; TLS is used with the other modes",
                ))
            }
            MySslMode::Disabled => TlsUse::Off,
            MySslMode::Preferred => TlsUse::Prefer(tls::MyTls::new(mode, ca.as_deref())?),
            _ => TlsUse::Require(tls::MyTls::new(mode, ca.as_deref())?),
        };
        let names = MyNames::new(options.table.as_deref().unwrap_or(DEFAULT_TABLE))?;
        let timeout_ms = options.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        Ok(MyConfig {
            target: Login {
                host,
                port: parsed.port().unwrap_or(3306),
                user,
                password,
                database,
            },
            tls,
            url,
            names,
            timeout_ms,
            create_table: options.create_table.unwrap_or(true),
            sweep_interval_ms: options
                .sweep_interval_ms
                .unwrap_or(DEFAULT_SWEEP_INTERVAL_MS),
            connections: options
                .connections
                .unwrap_or(DEFAULT_CONNECTIONS)
                .clamp(1, MAX_CONNECTIONS),
            // Half the call's time, in whole seconds (InnoDB's unit), at least 1.
            lock_s: (timeout_ms / 2000).max(1),
        })
    }

    fn secrets(&self) -> [&[u8]; 2] {
        [self.target.password.as_bytes(), self.url.as_bytes()]
    }
}

/// A protocol failure as a core error (its `sent` left to the caller), its
/// text cleaned of the store's secrets.
fn my_error(f: MyFailure, config: &MyConfig) -> Error {
    let (code, text) = match f {
        MyFailure::Io(text) => (
            "ERR_CONNECTION",
            format!("the connection to MySQL failed: {text}"),
        ),
        MyFailure::Login(text) => ("ERR_CONNECTION", text),
        MyFailure::Protocol(text) => (
            "ERR_CONNECTION",
            format!("MySQL's answer could not be read: {text}"),
        ),
        MyFailure::Server {
            code,
            state,
            message,
        } => {
            if state == codes::COUNT_RANGE_STATE && message.starts_with("ratestore:") {
                return Error::CountOutOfRange;
            }
            let js = match code {
                codes::ACCESS_DENIED
                | codes::DB_ACCESS_DENIED
                | codes::ACCESS_DENIED_NO_PASSWORD => "ERR_AUTH",
                _ => "ERR_MYSQL",
            };
            // Messages that quote the statement, or a row's key, are not passed on.
            let message = match code {
                codes::DUP_ENTRY | codes::PARSE_ERROR | codes::SYNTAX_ERROR => {
                    "(its message quotes the statement, and is left out)".to_string()
                }
                _ => message,
            };
            let hint = match code {
                codes::NO_SUCH_TABLE => " (the table is missing: create it with docs/mysql.sql, or leave createTable on)",
                codes::NO_SUCH_PROCEDURE => " (the store's procedure is missing: create it with docs/mysql.sql, or leave createTable on)",
                codes::READ_ONLY | codes::READ_ONLY_MODE => " (the server is read-only, e.g. a replica after a failover: the store connects again)",
                codes::NO_EXECUTE => " (the database user needs EXECUTE on the store's procedures)",
                _ => "",
            };
            (
                js,
                format!("MySQL answered {code} ({state}): {message}{hint}"),
            )
        }
    };
    Error::Sql {
        store: Backend::Mysql,
        code,
        text,
        sent: None,
    }
    .redacted(&config.secrets())
}

/// `e` with the `sent` flag a timeout or a lost connection carries.
pub(crate) fn with_sent(e: Error, sent: bool) -> Error {
    match e {
        Error::Sql {
            store: Backend::Mysql,
            code,
            text,
            sent: None,
        } if code == "ERR_TIMEOUT" || code == "ERR_CONNECTION" => {
            let tail = if sent {
                "; the call was sent, is not sent again, and may or may not have counted"
            } else {
                " before the call was sent; it did not count"
            };
            Error::Sql {
                store: Backend::Mysql,
                code,
                text: format!("{text}{tail}"),
                sent: Some(sent),
            }
        }
        Error::Sql {
            store: Backend::Mysql,
            code,
            text,
            sent: None,
        } if !sent && code != "ERR_CONFIG" => Error::Sql {
            store: Backend::Mysql,
            code,
            text,
            sent: Some(false),
        },
        other => other,
    }
}

pub(crate) fn timeout_error(ms: u64) -> Error {
    Error::Sql {
        store: Backend::Mysql,
        code: "ERR_TIMEOUT",
        text: format!("no answer from MySQL within {ms} ms"),
        sent: None,
    }
}

/// One store: its settings, its connections and its queue of calls.
pub struct MyStore {
    config: MyConfig,
    /// The connections, one per batch that may be on its way at once.
    slots: Vec<tokio::sync::Mutex<Option<(MyConn, u64)>>>,
    queue: std::sync::Mutex<queue::MyQueue>,
    /// Whether the tables and procedures were made (or createTable is off).
    created: tokio::sync::Mutex<bool>,
    /// Set by a read-only answer: every connection is replaced.
    generation: AtomicU64,
    backoff: std::sync::Mutex<Backoff>,
    swept: Arc<AtomicU64>,
    closed: AtomicBool,
}

/// Rows one sweep statement removes at most.
const SWEEP_BATCH: u64 = 500;
const SWEEP_PAUSE: Duration = Duration::from_millis(20);

impl MyStore {
    pub fn new(config: MyConfig, swept: Arc<AtomicU64>) -> MyStore {
        let slots = (0..config.connections)
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        let created = !config.create_table;
        MyStore {
            queue: std::sync::Mutex::new(queue::MyQueue::new(config.connections)),
            slots,
            created: tokio::sync::Mutex::new(created),
            generation: AtomicU64::new(0),
            backoff: std::sync::Mutex::new(Backoff::new(
                u64::from(std::process::id()) ^ (Arc::as_ptr(&swept) as u64),
            )),
            swept,
            closed: AtomicBool::new(false),
            config,
        }
    }

    pub fn timeout_ms(&self) -> u64 {
        self.config.timeout_ms
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, f: MyFailure) -> Error {
        let read_only = matches!(
            f,
            MyFailure::Server {
                code: codes::READ_ONLY | codes::READ_ONLY_MODE,
                ..
            }
        );
        if read_only {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        my_error(f, &self.config)
    }

    /// A new connection, after the backoff allows it; the tables made on
    /// the store's first.
    async fn connect(&self) -> Result<(MyConn, u64)> {
        if let Gate::Refuse(e) = self.backoff().gate(Instant::now()) {
            return Err(e);
        }
        let generation = self.generation.load(Ordering::Relaxed);
        let result = async {
            let mut conn = MyConn::connect(&self.config.target, &self.config.tls)
                .await
                .map_err(|f| with_sent(self.error(f), false))?;
            let mut created = self.created.lock().await;
            if !*created {
                let (sql, _) = schema::create_batch(&self.config.names);
                match conn.query(&sql).await {
                    Ok((_, None)) => *created = true,
                    Ok((_, Some(f))) | Err(f) => return Err(with_sent(self.error(f), false)),
                }
            }
            Ok(conn)
        };
        match tokio::time::timeout(Duration::from_millis(self.config.timeout_ms), result).await {
            Ok(Ok(conn)) => {
                self.backoff().succeeded();
                Ok((conn, generation))
            }
            Ok(Err(e)) => {
                self.backoff().failed(Instant::now(), e.clone());
                Err(e)
            }
            Err(_) => {
                let e = with_sent(timeout_error(self.config.timeout_ms), false);
                self.backoff().failed(Instant::now(), e.clone());
                Err(e)
            }
        }
    }

    /// Ends the server's session of a connection whose query did not answer
    /// in time (a row lock, a stalled server), from a connection of its own,
    /// so that nothing of it keeps waiting there.
    fn kill(&self, thread_id: u32) {
        let target = self.config.target.clone();
        let tls = self.config.tls.clone();
        let bound = Duration::from_millis(self.config.timeout_ms);
        tokio::spawn(async move {
            let kill = async {
                if let Ok(mut conn) = MyConn::connect(&target, &tls).await {
                    let _ = conn.query(&format!("KILL {thread_id}")).await;
                }
            };
            let _ = tokio::time::timeout(bound, kill).await;
        });
    }

    /// Starts the sweeper (unless `sweepIntervalMs` is 0): every interval,
    /// while the store is open and has an idle connection, it deletes expired
    /// rows in small batches. It never connects on its own.
    pub fn start_sweeper(store: &Arc<MyStore>, handle: &tokio::runtime::Handle) {
        crate::sweep::start(
            store,
            store.config.sweep_interval_ms,
            handle,
            |store| store.closed.load(Ordering::Relaxed),
            // A failed sweep waits for the next interval.
            |store| async move {
                let _ = store.sweep().await;
            },
        );
    }

    /// One sweep of the three tables; answers the rows it removed.
    pub async fn sweep(&self) -> Result<u64> {
        let n = &self.config.names;
        let lock = self.config.lock_s;
        let now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
        let mut removed = 0;
        for (state, (table, column)) in [
            (&n.table, "reset_us"),
            (&n.sliding, "expires_us"),
            (&n.bucket, "expires_us"),
        ]
        .into_iter()
        .enumerate()
        {
            let sql = format!(
                "/*M!100301 SET STATEMENT innodb_lock_wait_timeout={lock} FOR */ DELETE \
                 /*+ SET_VAR(innodb_lock_wait_timeout={lock}) */ FROM {table} WHERE {column} < {now} \
                 ORDER BY {column} LIMIT {SWEEP_BATCH}"
            );
            loop {
                // An idle connection only: hits come first.
                let Some(mut slot) = self.slots.iter().find_map(|s| s.try_lock().ok()) else {
                    return Ok(removed);
                };
                let Some((conn, _)) = slot.as_mut() else {
                    return Ok(removed);
                };
                let run = tokio::time::timeout(
                    Duration::from_millis(self.config.timeout_ms),
                    conn.query(&sql),
                )
                .await;
                let n = match run {
                    Ok(Ok((replies, None))) => match replies.first() {
                        Some(proto::StatementResult::Done { affected }) => *affected,
                        _ => 0,
                    },
                    Ok(Ok((
                        _,
                        Some(MyFailure::Server {
                            code: codes::NO_SUCH_TABLE,
                            ..
                        }),
                    ))) if state > 0 => break,
                    Ok(Ok((_, Some(f)))) => return Err(self.error(f)),
                    Ok(Err(f)) => {
                        slot.take();
                        return Err(self.error(f));
                    }
                    Err(_) => {
                        if let Some((conn, _)) = slot.take() {
                            self.kill(conn.thread_id);
                        }
                        return Ok(removed);
                    }
                };
                drop(slot);
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

    /// Drops the idle connections; the ones in use close after their batch.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        for slot in &self.slots {
            slot.lock().await.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(url: &str) -> Result<MyConfig> {
        let options = MyOptions {
            url: Some(url.into()),
            ..MyOptions::default()
        };
        MyConfig::resolve(&options, |_| None)
    }

    #[test]
    fn a_missing_url_names_the_variables() {
        let err = MyConfig::resolve(&MyOptions::default(), |_| None)
            .err()
            .unwrap();
        assert_eq!(err.code(), "ERR_CONFIG");
        assert!(err.to_string().contains("DATABASE_URL"));
        assert!(err.to_string().contains("MYSQL_URL"));
    }

    #[test]
    fn the_url_option_wins_then_database_url() {
        let env = |name: &str| (name == "MYSQL_URL").then(|| "mysql://u@h:1/b".to_string());
        let config = MyConfig::resolve(&MyOptions::default(), env).ok().unwrap();
        assert_eq!(config.target.database.as_deref(), Some("b"));
        let both = |name: &str| match name {
            "DATABASE_URL" => Some("mysql://u@h:1/first".to_string()),
            _ => Some("mysql://u@h:1/second".to_string()),
        };
        let config = MyConfig::resolve(&MyOptions::default(), both).ok().unwrap();
        assert_eq!(config.target.database.as_deref(), Some("first"));
    }

    #[test]
    fn urls_of_other_clients_are_read() {
        let c = resolve(
            "mysql://us%40er:p%2Fw@db.example:3307/app?sslaccept=strict&connection_limit=1",
        )
        .ok()
        .unwrap();
        assert_eq!(
            (c.target.user.as_str(), c.target.password.as_str()),
            ("us@er", "p/w")
        );
        assert_eq!(
            (c.target.host.as_str(), c.target.port),
            ("db.example", 3307)
        );
        assert!(matches!(c.tls, TlsUse::Require(_)));
        assert!(resolve("mysql://u@h/d?ssl={\"rejectUnauthorized\":true}").is_ok());
        assert!(matches!(
            resolve("mysql://u@h/d?ssl-mode=DISABLED").ok().unwrap().tls,
            TlsUse::Off
        ));
        assert!(matches!(
            resolve("mysql://u@h/d").ok().unwrap().tls,
            TlsUse::Prefer(_)
        ));
        let err = resolve("mysql://u:secret@h/d?nope=secret").err().unwrap();
        assert!(err.to_string().contains("\"nope\""));
        assert_eq!(err.to_string().matches("secret").count(), 0);
        assert!(resolve("postgres://u@h/d").is_err());
    }

    #[test]
    fn the_lock_wait_is_half_the_timeout_in_whole_seconds() {
        let lock = |ms| {
            let options = MyOptions {
                url: Some("mysql://u@h/d".into()),
                timeout_ms: Some(ms),
                ..MyOptions::default()
            };
            MyConfig::resolve(&options, |_| None).ok().unwrap().lock_s
        };
        assert_eq!((lock(500), lock(2000), lock(10_000)), (1, 1, 5));
    }
}
