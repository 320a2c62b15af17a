//! postgresStore's core: the fixed window in seed 000's table (`key text
//! PRIMARY KEY, total bigint, reset_at timestamptz`), one statement per hit,
//! on the database's clock (`now()`), run on the shared I/O thread.
//!
//! Every statement goes out unnamed (`query_typed`: Parse, Bind, Execute in
//! one round trip, no prepared statement kept), so nothing depends on the
//! session and the store works through PgBouncer's transaction mode.
//! Concurrent calls share one connection: tokio-postgres pipelines them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

use crate::errors::{Error, Result};
use crate::ops::{Answer, Args, Op};
use crate::window::MAX_SAFE;

/// The environment variables read for the URL, in order.
pub const URL_VARIABLES: [&str; 2] = ["DATABASE_URL", "POSTGRES_URL"];
pub const DEFAULT_TABLE: &str = "askdare_counters";
pub const DEFAULT_TIMEOUT_MS: u64 = 2000;

/// The options as JavaScript gave them (checked there).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub url: Option<String>,
    pub table: Option<String>,
    pub schema: Option<String>,
    pub timeout_ms: Option<u64>,
    pub create_table: Option<bool>,
}

/// The settings, resolved against the environment.
#[derive(Clone)]
pub struct Config {
    pg: tokio_postgres::Config,
    /// The password, kept to clean it out of any message.
    password: Vec<u8>,
    url: String,
    /// The table's name, quoted (and schema-qualified when a schema is given).
    table: String,
    pub timeout_ms: u64,
    create_table: bool,
}

fn config_error(text: impl Into<String>) -> Error {
    Error::Postgres {
        code: "ERR_CONFIG",
        text: text.into(),
    }
}

/// `name` quoted as an SQL identifier.
fn quote(name: &str) -> Result<String> {
    if name.is_empty() || name.contains('\0') {
        return Err(config_error("table and schema must be non-empty names"));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
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
        let pg: tokio_postgres::Config = url.parse().map_err(|_| {
            config_error("the database URL can't be parsed (expected postgres://user:password@host:port/database)")
        })?;
        let password = pg.get_password().map(<[u8]>::to_vec).unwrap_or_default();
        if pg.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(config_error(
                "sslmode=require is not supported yet; use sslmode=disable on a trusted network",
            ));
        }
        let mut table = quote(options.table.as_deref().unwrap_or(DEFAULT_TABLE))?;
        if let Some(schema) = &options.schema {
            table = format!("{}.{}", quote(schema)?, table);
        }
        Ok(Config {
            pg,
            password,
            url,
            table,
            timeout_ms: options.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            create_table: options.create_table.unwrap_or(true),
        })
    }

    fn secrets(&self) -> [&[u8]; 2] {
        [&self.password, self.url.as_bytes()]
    }
}

/// The statements, for one table. `ended` is the seed's rule with the other
/// stores' edge: a window with under 1 ms left counts as ended.
struct Sql {
    create: String,
    hit: String,
    read: String,
    consume: String,
    refund: String,
    unlink: String,
    reset_all: String,
}

const ENDED: &str = "c.reset_at - now() < interval '1 millisecond'";
const RESET_MS: &str = "ceil(extract(epoch FROM reset_at - now()) * 1000)::int8";

impl Sql {
    fn new(t: &str) -> Sql {
        let upsert_set = format!(
            "total = CASE WHEN {ENDED} THEN EXCLUDED.total ELSE c.total + EXCLUDED.total END, \
             reset_at = CASE WHEN {ENDED} THEN EXCLUDED.reset_at ELSE c.reset_at END"
        );
        let opens = "now() + interval '1 millisecond' * $3::int8::float8";
        Sql {
            // The lock makes instances that start together create it one at a time.
            create: format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('ratestore:' || '{lock}')); \
                 CREATE TABLE IF NOT EXISTS {t} (key text PRIMARY KEY, total bigint NOT NULL, \
                 reset_at timestamptz NOT NULL); COMMIT",
                lock = t.replace('\'', "''"),
            ),
            // $1 key, $2 amount, $3 windowMs. No row back: the count would
            // leave the safe-integer range, and nothing was changed.
            hit: format!(
                "INSERT INTO {t} AS c (key, total, reset_at) VALUES ($1, $2, {opens}) \
                 ON CONFLICT (key) DO UPDATE SET {upsert_set} \
                 WHERE {ENDED} OR abs(c.total + EXCLUDED.total) <= {MAX_SAFE} \
                 RETURNING total, {RESET_MS}"
            ),
            read: format!("SELECT total, {RESET_MS} FROM {t} c WHERE key = $1 AND NOT ({ENDED})"),
            // $1 key, $2 cost, $3 windowMs, $4 limit. No row back: refused.
            consume: format!(
                "INSERT INTO {t} AS c (key, total, reset_at) SELECT $1, $2, {opens} WHERE $2 <= $4 \
                 ON CONFLICT (key) DO UPDATE SET {upsert_set} \
                 WHERE {ENDED} OR c.total + EXCLUDED.total <= $4 \
                 RETURNING total, {RESET_MS}"
            ),
            // $1 key, $2 amount: never below 0, only in an open window.
            refund: format!(
                "UPDATE {t} c SET total = total - LEAST($2, GREATEST(total, 0)) \
                 WHERE key = $1 AND NOT ({ENDED}) RETURNING total, {RESET_MS}"
            ),
            unlink: format!("DELETE FROM {t} WHERE key = $1"),
            reset_all: format!("DELETE FROM {t}"),
        }
    }
}

/// One store's connection and statements.
pub struct PgStore {
    config: Config,
    sql: Sql,
    client: Mutex<Option<Arc<Client>>>,
}

/// A tokio-postgres error as a core error, its text cleaned of `secrets`.
fn pg_error(e: tokio_postgres::Error, secrets: &[&[u8]]) -> Error {
    let (code, text) = match e.as_db_error() {
        Some(db) => {
            let state = db.code().code();
            let code = match state {
                "28P01" | "28000" => "ERR_AUTH",
                _ => "ERR_POSTGRES",
            };
            let hint = if state == "42P01" {
                " (the table is missing: create it with docs/postgres.sql, or leave createTable on)"
            } else {
                ""
            };
            (
                code,
                format!("PostgreSQL answered {state}: {}{hint}", db.message()),
            )
        }
        // No answer from the server: the connection failed or was lost.
        None => (
            "ERR_CONNECTION",
            format!("the connection to PostgreSQL failed: {e}"),
        ),
    };
    Error::Postgres { code, text }.redacted(secrets)
}

impl PgStore {
    pub fn new(config: Config) -> PgStore {
        let sql = Sql::new(&config.table);
        PgStore {
            config,
            sql,
            client: Mutex::new(None),
        }
    }

    pub fn timeout_ms(&self) -> u64 {
        self.config.timeout_ms
    }

    fn error(&self, e: tokio_postgres::Error) -> Error {
        pg_error(e, &self.config.secrets())
    }

    /// The open connection, connecting (and creating the table) first if
    /// there is none or it was lost. One connect at a time: the lock.
    async fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if let Some(client) = &*slot {
            if !client.is_closed() {
                return Ok(Arc::clone(client));
            }
        }
        let (client, connection) = self
            .config
            .pg
            .connect(NoTls)
            .await
            .map_err(|e| self.error(e))?;
        tokio::spawn(connection);
        if self.config.create_table {
            client
                .batch_execute(&self.sql.create)
                .await
                .map_err(|e| self.error(e))?;
        }
        let client = Arc::new(client);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Runs one op within the store's timeout.
    pub async fn run(&self, op: Op, args: Args, key: String) -> Result<Answer> {
        let ms = self.config.timeout_ms;
        match tokio::time::timeout(Duration::from_millis(ms), self.run_op(op, args, key)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Postgres {
                code: "ERR_TIMEOUT",
                text: format!("no answer from PostgreSQL within {ms} ms; the call may or may not have counted"),
            }),
        }
    }

    async fn row(
        &self,
        client: &Client,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<(i64, i64)>> {
        let rows = client
            .query_typed(sql, params)
            .await
            .map_err(|e| self.error(e))?;
        Ok(rows.first().map(|row| (row.get(0), row.get(1))))
    }

    async fn run_op(&self, op: Op, args: Args, key: String) -> Result<Answer> {
        let client = self.client().await?;
        let key: &(dyn ToSql + Sync) = &key;
        let k = || (key, Type::TEXT);
        match op {
            Op::Hit => {
                let [window_ms, amount, ..] = args;
                if amount == 0 {
                    let row = self.row(&client, &self.sql.read, &[k()]).await?;
                    let (count, reset) = row.unwrap_or((0, window_ms));
                    return Ok(Answer::new(&[count, reset]));
                }
                let row = self
                    .row(
                        &client,
                        &self.sql.hit,
                        &[k(), (&amount, Type::INT8), (&window_ms, Type::INT8)],
                    )
                    .await?;
                let (count, reset) = row.ok_or(Error::CountOutOfRange)?;
                Ok(Answer::new(&[count, reset]))
            }
            Op::Consume => {
                let [window_ms, limit, cost, _] = args;
                let taken = if cost > 0 {
                    self.row(
                        &client,
                        &self.sql.consume,
                        &[
                            k(),
                            (&cost, Type::INT8),
                            (&window_ms, Type::INT8),
                            (&limit, Type::INT8),
                        ],
                    )
                    .await?
                } else {
                    None
                };
                let (allowed, (count, reset)) = match taken {
                    Some(row) => (true, row),
                    None => {
                        // Refused (or cost 0): nothing was written; the count as it stands.
                        let row = self.row(&client, &self.sql.read, &[k()]).await?;
                        let row = row.unwrap_or((0, window_ms));
                        (cost == 0 && row.0 <= limit, row)
                    }
                };
                let remaining = (limit - count).clamp(0, limit);
                Ok(Answer::new(&[allowed as i64, count, remaining, reset]))
            }
            Op::Refund => {
                let [amount, ..] = args;
                let row = self
                    .row(&client, &self.sql.refund, &[k(), (&amount, Type::INT8)])
                    .await?;
                let (count, reset) = row.unwrap_or((0, 0));
                Ok(Answer::new(&[count, reset]))
            }
            Op::Unlink => {
                if args[0] != 0 {
                    // No sliding-window or token-bucket state is kept here yet.
                    return Ok(Answer::new(&[0]));
                }
                let n = client
                    .execute_typed(&self.sql.unlink, &[k()])
                    .await
                    .map_err(|e| self.error(e))?;
                Ok(Answer::new(&[n as i64]))
            }
            Op::Ping => {
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| self.error(e))?;
                Ok(Answer::new(&[1]))
            }
            Op::SlidingIncrement | Op::SlidingDecrement | Op::SlidingConsume | Op::Bucket => {
                Err(Error::Unsupported(
                    "postgresStore: the sliding window and the token bucket are not available yet",
                ))
            }
        }
    }

    /// Deletes every counter of the table.
    pub async fn reset_all(&self) -> Result<()> {
        let ms = self.config.timeout_ms;
        let work = async {
            let client = self.client().await?;
            client
                .batch_execute(&self.sql.reset_all)
                .await
                .map_err(|e| self.error(e))
        };
        match tokio::time::timeout(Duration::from_millis(ms), work).await {
            Ok(result) => result,
            Err(_) => Err(Error::Postgres {
                code: "ERR_TIMEOUT",
                text: format!("no answer from PostgreSQL within {ms} ms"),
            }),
        }
    }

    /// Drops the connection (calls in flight fail).
    pub async fn close(&self) {
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
        assert_eq!(config.table, "\"s\".\"we\"\"ird\"");
    }
}
