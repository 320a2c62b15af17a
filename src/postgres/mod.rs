//! postgresStore's core: the fixed window in the reference layout's table
//! (`key text PRIMARY KEY, total bigint, reset_at timestamptz`, the user's
//! original `pg` store), on the database's clock (`now()`), run on the
//! shared I/O thread (`crate::runtime`).
//!
//! Statements are prepared once per connection where no transaction pooler
//! sits between (SQL `PREPARE` under names of the connection's own); a
//! missing statement (26000) or `?pgbouncer=true` means a pooler, and from
//! then on every statement goes out unnamed, so nothing depends on the
//! session. Concurrent calls share one connection, in one queue: the calls
//! made while a statement is on the way go out together ([`queue`]).
//!
//! Many instances on one database: a batch locks its rows in one global
//! order (by table, then key), so two batches never deadlock each other;
//! every statement waits for a row lock at most `lock_timeout` (set by the
//! statement itself), and runs at READ COMMITTED whatever the session's
//! default; a key whose row another session holds is served on a second
//! connection, so it stalls only its own calls ([`queue`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

use crate::errors::{Backend, Error, Result};
use crate::health::{Backoff, Gate, TIMEOUTS_BEFORE_REPLACING};
use crate::ops::{Answer, Args, Op};
use crate::window::MAX_SAFE;

mod codes;
mod queue;
pub use queue::Queued;
pub mod schema;
mod tls;
use queue::{Encoded, Kind, StepWork, Work};
use schema::Names;
use tls::{SslMode, Tls};

/// The environment variables read for the URL, in order.
pub const URL_VARIABLES: [&str; 2] = ["DATABASE_URL", "POSTGRES_URL"];
pub const DEFAULT_TABLE: &str = "askdare_counters";
pub const DEFAULT_TIMEOUT_MS: u64 = 2000;
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;
/// The connections a store opens at most: one for the calls, one for the
/// keys whose rows another session holds (and the sweeper).
pub const MAX_CONNECTIONS: usize = 2;
/// Keys longer than this (in UTF-8 bytes) are stored as their first bytes
/// and their SHA-256 (see [`stored_key`]): every key up to the 1 MiB that
/// every store takes fits PostgreSQL's index.
pub const MAX_PLAIN_KEY_BYTES: usize = 1024;

/// The options as JavaScript gave them (checked there).
#[derive(Clone, Debug, Default)]
pub struct PgOptions {
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
pub struct PgConfig {
    pg: tokio_postgres::Config,
    /// The password, kept to clean it out of any message.
    password: Vec<u8>,
    url: String,
    /// The table's name as given.
    table: String,
    /// The tables' and functions' names, quoted: set when a schema is given,
    /// else resolved on the first connection ([`PgStore::resolve`]).
    names: Option<Names>,
    pub timeout_ms: u64,
    create_table: bool,
    /// TLS, unless `sslmode` is `disable`.
    tls: Option<Tls>,
    sweep_interval_ms: u64,
    /// Connections at most (1 or [`MAX_CONNECTIONS`]; the URL's `connection_limit`).
    connections: usize,
    /// The URL's `pgbouncer=true`: every statement goes out unnamed.
    pooled: bool,
}

fn config_error(text: impl Into<String>) -> Error {
    Error::Sql {
        store: Backend::Postgres,
        code: "ERR_CONFIG",
        text: text.into(),
        sent: None,
    }
}

/// `text` with its `%XX` escapes decoded (as a URL's query value).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the parameters of pg's and Prisma's URLs that tokio-postgres does
/// not know say to postgresStore.
#[derive(Default, Debug, PartialEq, Eq)]
struct Extra {
    /// `connection_limit`.
    connections: Option<usize>,
    /// Prisma's `schema`.
    schema: Option<String>,
    /// `pgbouncer=true`: a transaction pooler sits between, so no statement is prepared.
    pooled: bool,
}

/// Takes out of a URL's query the parameters of pg and Prisma that
/// tokio-postgres does not know, and rewrites those with a libpq meaning:
/// `ssl=true` is `sslmode=verify-full` (pg's: a verified TLS connection),
/// `ssl=false` `sslmode=disable`, `sslmode=no-verify` (pg's) `require`;
/// `pgbouncer=true` says a transaction pooler sits between (no statement is
/// prepared); `statement_cache_size`, `uselibpqcompat`, `pool_timeout` and
/// `socket_timeout` are accepted and change nothing (sslmode always means
/// what it means to libpq).
fn split_extra(url: &str) -> Result<(String, Extra)> {
    let mut extra = Extra::default();
    let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) else {
        return Ok((url.to_string(), extra));
    };
    let boolean = |name: &str, v: &str| match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(config_error(format!(
            "the database URL's parameter {name} must be true or false"
        ))),
    };
    let mut kept: Vec<String> = Vec::new();
    let mut ssl = None;
    let mut has_sslmode = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "pgbouncer" => extra.pooled = boolean(name, value)?,
            "uselibpqcompat" => {
                boolean(name, value)?;
            }
            "statement_cache_size" | "pool_timeout" | "socket_timeout" => {
                if value.parse::<u64>().is_err() {
                    return Err(config_error(format!(
                        "the database URL's parameter {name} must be a whole number"
                    )));
                }
            }
            "connection_limit" => match value.parse::<usize>() {
                Ok(n) if n >= 1 => extra.connections = Some(n.min(MAX_CONNECTIONS)),
                _ => return Err(config_error(
                    "the database URL's parameter connection_limit must be a whole number from 1",
                )),
            },
            "schema" => extra.schema = Some(percent_decoded(value)),
            "ssl" => ssl = Some(boolean(name, value)?),
            "sslmode" if value == "no-verify" => {
                has_sslmode = true;
                kept.push("sslmode=require".into());
            }
            _ => {
                has_sslmode |= name == "sslmode";
                kept.push(pair.to_string());
            }
        }
    }
    match ssl {
        Some(on) if !has_sslmode => kept.push(format!(
            "sslmode={}",
            if on { "verify-full" } else { "disable" }
        )),
        _ => {}
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, extra))
}

/// The error for a URL tokio-postgres can't parse: naming the parameter it
/// refuses, if one is to blame (never a value, which may hold a password).
fn url_error(rest: &str) -> Error {
    if let Some((_, query)) = rest.split_once('?').filter(|_| rest.contains("://")) {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let probe = format!("postgres://localhost/?{pair}");
            if probe.parse::<tokio_postgres::Config>().is_err() {
                let name = pair.split_once('=').map_or(pair, |(n, _)| n);
                let shown: String = name
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .take(40)
                    .collect();
                return config_error(format!(
                    "the database URL's parameter {shown:?} is not one postgresStore knows, or its value is wrong \
                     (see the README's postgresStore URL parameters)"
                ));
            }
        }
    }
    config_error(
        "the database URL can't be parsed (expected postgres://user:password@host:port/database)",
    )
}

impl PgConfig {
    /// Resolves `options` against the environment that `env` reads.
    pub fn resolve(options: &PgOptions, env: impl Fn(&str) -> Option<String>) -> Result<PgConfig> {
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
        let (known, extra) = split_extra(&url)?;
        let (rest, url_mode, root) = tls::split_url(&known);
        let mut pg: tokio_postgres::Config = rest.parse().map_err(|_| url_error(&rest))?;
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
        let table = options.table.as_deref().unwrap_or(DEFAULT_TABLE);
        let schema = options.schema.as_deref().or(extra.schema.as_deref());
        // Checked here even when the schema is resolved later.
        let checked = Names::new(table, schema.or(Some("public")))?;
        let names = schema.map(|_| checked);
        Ok(PgConfig {
            pg,
            password,
            url,
            table: table.to_string(),
            names,
            timeout_ms: options.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            create_table: options.create_table.unwrap_or(true),
            tls,
            sweep_interval_ms: options
                .sweep_interval_ms
                .unwrap_or(DEFAULT_SWEEP_INTERVAL_MS),
            connections: extra.connections.unwrap_or(MAX_CONNECTIONS),
            pooled: extra.pooled,
        })
    }

    fn secrets(&self) -> [&[u8]; 2] {
        [&self.password, self.url.as_bytes()]
    }
}

/// The key as stored: itself up to [`MAX_PLAIN_KEY_BYTES`] bytes; a longer
/// one as its first bytes (up to that many, at a character's boundary), a
/// U+0001 and its SHA-256 in hex. A stored long key is longer than any key
/// stored as itself, so the two never meet; two long keys share a row only
/// if their SHA-256 do.
pub fn stored_key(key: String) -> String {
    use sha2::{Digest, Sha256};
    if key.len() <= MAX_PLAIN_KEY_BYTES {
        return key;
    }
    let mut cut = MAX_PLAIN_KEY_BYTES;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = Sha256::digest(key.as_bytes());
    let mut stored = String::with_capacity(cut + 1 + 64);
    stored.push_str(&key[..cut]);
    stored.push('\u{1}');
    for byte in digest.iter() {
        stored.push_str(&format!("{byte:02x}"));
    }
    stored
}

/// The text a statement's range check raises (as an int8 that can't be
/// parsed, SQLSTATE 22P02) when a function answered a count past ±(2^53 - 1):
/// the statement fails, so nothing of it is applied. (The text depends on
/// the answer, so that the planner can't fold the cast, and fail, ahead.)
const COUNT_RANGE_MARK: &str = "ratestore_count_range";

/// `x.r`, a function's answer, unless one of its integers is past the safe range.
fn checked_answer() -> String {
    format!(
        "CASE WHEN EXISTS (SELECT FROM unnest(x.r) v WHERE v NOT BETWEEN -{MAX_SAFE} AND {MAX_SAFE}) \
         THEN ('{{{COUNT_RANGE_MARK}' || cardinality(x.r) || '}}')::int8[] ELSE x.r END"
    )
}

/// The statements, for one set of names. Each operation is one call of the
/// algorithm's PL/pgSQL function (src/postgres/schema.rs), whose statements
/// PostgreSQL plans once per session: the client sends one short statement.
///
/// Every statement that locks a row first sets `lock_timeout` for itself
/// (`set_config(…, true)`: it lasts to the statement's end), from its last
/// parameter, before any lock is asked for: `cfg` is joined before the
/// function's row (`WHERE cfg.s IS NOT NULL` makes the function's subquery
/// depend on it).
struct Sql {
    create: String,
    /// One call alone, by [`Kind`].
    single: [String; 3],
    /// One statement for a batch of calls, by the set of algorithms in it
    /// (bit 0 the fixed window, 1 the sliding window, 2 the bucket): a
    /// database with only some functions (createTable: false) runs the
    /// batches that name only those.
    batch: [String; 8],
    /// A step's first statement, by the set of algorithms in it ([`step_sql`]).
    step: [String; 8],
    unlink: [String; 3],
    reset_all: [String; 3],
    /// The sweeper's statements: by the end column's index, or a range of pages.
    sweep: [String; 3],
    sweep_pages: [String; 3],
    /// Whether the table has a valid index led by its end column; its size in pages.
    has_index: String,
    pages: String,
    /// The three tables' (qualified, quoted) names and end columns.
    tables: [(String, &'static str); 3],
    /// The fixed window's hit of a positive amount, alone: seed 000's upsert
    /// with the function's rules ([`hit_sql`]).
    hit: String,
    /// A batch of such hits, a key's together: one upsert of every key ([`hits_sql`]).
    hits: String,
}

/// The statements that are prepared where no transaction pooler sits
/// between: [`Sql::single`] (0-2, by [`Kind`]), [`Sql::batch`] (3-10, by
/// the set of algorithms), [`Sql::hit`] (11), [`Sql::hits`] (12).
const STATEMENTS: usize = 13;
const BATCH_AT: usize = 3;
const HIT_AT: usize = 11;
const HITS_AT: usize = 12;

impl Sql {
    /// Statement `at`'s text.
    fn text(&self, at: usize) -> &str {
        match at {
            0..BATCH_AT => &self.single[at],
            HIT_AT => &self.hit,
            HITS_AT => &self.hits,
            _ => &self.batch[at - BATCH_AT],
        }
    }

    /// Statement `at`'s parameters' types, for `PREPARE`.
    fn types(at: usize) -> &'static str {
        match at {
            0 | 1 => "int4, text, int8, int8, int8, text",
            2 => "text, int8, int8, int8, int8, text",
            HIT_AT => "text, int8, int8, text",
            HITS_AT => "text[], int8[], int8[], text",
            _ => "int4[], int4[], text[], int8[], int8[], int8[], int8[], text",
        }
    }
}

/// The fixed window's hit (`$2` > 0 on key `$1`, a window of `$3` ms) as
/// one upsert, `$4` its lock_timeout: the function's rules (a window is open
/// while reset_at's ms tick is after now's; a count past the safe range
/// fails the statement), answering `(count, resetMs)`. The time is the
/// statement's (`now()`, read before the row's lock): a hit that waited for
/// another session's lock counts in the window that session left, its
/// resetMs counted from the statement's start.
fn hit_sql(table: &str) -> String {
    format!(
        "WITH cfg AS (SELECT set_config('lock_timeout', $4, true) AS s) \
         INSERT INTO {table} AS c (key, total, reset_at) \
         SELECT $1, $2, now() + interval '1 millisecond' * $3 FROM cfg WHERE cfg.s IS NOT NULL \
         {}",
        upsert_tail()
    )
}

/// [`hit_sql`]'s upsert for a batch of hits: `$1` the keys (each once, in
/// lock order), `$2` the sum of each key's amounts, `$3` the window of its
/// first hit. Answers `(i, count, resetMs)` for the `i`th key (from 1), in
/// order: a key's hits count `count - sum + ` their running sum.
fn hits_sql(table: &str) -> String {
    format!(
        "WITH cfg AS (SELECT set_config('lock_timeout', $4, true) AS s), \
         ins AS (INSERT INTO {table} AS c (key, total, reset_at) \
         SELECT u.k, u.a, now() + interval '1 millisecond' * u.w \
         FROM cfg, unnest($1::text[], $2::int8[], $3::int8[]) WITH ORDINALITY AS u(k, a, w, i) \
         WHERE cfg.s IS NOT NULL ORDER BY u.i \
         {}, key) \
         SELECT u.i, ins.total, ins.r FROM ins JOIN unnest($1::text[]) WITH ORDINALITY AS u(k, i) \
         ON u.k = ins.key ORDER BY u.i",
        upsert_tail()
    )
}

/// The conflict clause and answer of [`hit_sql`] and [`hits_sql`].
fn upsert_tail() -> String {
    let open =
        "floor(extract(epoch FROM c.reset_at) * 1000) > floor(extract(epoch FROM now()) * 1000)";
    format!(
        "ON CONFLICT (key) DO UPDATE SET \
         total = CASE WHEN {open} THEN CASE WHEN abs(c.total + EXCLUDED.total) > {MAX_SAFE} \
         THEN ('{COUNT_RANGE_MARK}' || c.total)::int8 ELSE c.total + EXCLUDED.total END \
         ELSE EXCLUDED.total END, \
         reset_at = CASE WHEN {open} THEN c.reset_at ELSE EXCLUDED.reset_at END \
         RETURNING total, floor(extract(epoch FROM reset_at) * 1000)::int8 \
         - floor(extract(epoch FROM now()) * 1000)::int8 AS r"
    )
}

/// A statement's argument: as a parameter (unnamed statements), or as a
/// literal (`EXECUTE` of a prepared one).
enum Lit<'a> {
    I32(i32),
    I64(i64),
    Text(&'a str),
    I32s(&'a [i32]),
    I64s(&'a [i64]),
    Texts(&'a [&'a str]),
}

impl Lit<'_> {
    fn param(&self) -> (&(dyn ToSql + Sync), Type) {
        match self {
            Lit::I32(v) => (v, Type::INT4),
            Lit::I64(v) => (v, Type::INT8),
            Lit::Text(v) => (v, Type::TEXT),
            Lit::I32s(v) => (v, Type::INT4_ARRAY),
            Lit::I64s(v) => (v, Type::INT8_ARRAY),
            Lit::Texts(v) => (v, Type::TEXT_ARRAY),
        }
    }

    /// Appends the literal: integers in decimal, text in the escape form
    /// (its meaning does not depend on `standard_conforming_strings`).
    fn write(&self, out: &mut String) {
        use std::fmt::Write;
        let text = |out: &mut String, v: &str| {
            out.push_str("E'");
            for c in v.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("''"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        };
        let list = |out: &mut String, items: &mut dyn Iterator<Item = i64>| {
            out.push_str("'{");
            for (i, v) in items.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{v}");
            }
            out.push_str("}'");
        };
        match self {
            Lit::I32(v) => {
                let _ = write!(out, "{v}");
            }
            Lit::I64(v) => {
                let _ = write!(out, "{v}");
            }
            Lit::Text(v) => text(out, v),
            Lit::I32s(v) => list(out, &mut v.iter().map(|&n| i64::from(n))),
            Lit::I64s(v) => list(out, &mut v.iter().copied()),
            Lit::Texts([]) => out.push_str("'{}'"),
            Lit::Texts(v) => {
                out.push_str("ARRAY[");
                for (i, item) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    text(out, item);
                }
                out.push(']');
            }
        }
    }
}

/// What a statement's rows hold: an `int8[]` (the functions'), or two
/// `int8`s (the hit's upsert), or three (the hits' upsert).
#[derive(Clone, Copy)]
enum Shape {
    Array,
    Pair,
    Triple,
}

impl Shape {
    fn read(self, row: &Row) -> Option<Vec<i64>> {
        match self {
            Shape::Array => row.try_get(0).ok(),
            Shape::Pair => Some(vec![row.try_get(0).ok()?, row.try_get(1).ok()?]),
            Shape::Triple => Some(vec![
                row.try_get(0).ok()?,
                row.try_get(1).ok()?,
                row.try_get(2).ok()?,
            ]),
        }
    }

    /// The same from a row of the simple query protocol (text).
    fn read_text(self, row: &tokio_postgres::SimpleQueryRow) -> Option<Vec<i64>> {
        match self {
            Shape::Array => {
                let text = row.get(0)?;
                let inner = text.strip_prefix('{')?.strip_suffix('}')?;
                if inner.is_empty() {
                    return Some(Vec::new());
                }
                inner.split(',').map(|v| v.parse().ok()).collect()
            }
            Shape::Pair | Shape::Triple => {
                let len = if matches!(self, Shape::Pair) { 2 } else { 3 };
                (0..len).map(|at| row.get(at)?.parse().ok()).collect()
            }
        }
    }
}

impl Sql {
    fn new(n: &Names) -> Sql {
        let tables = [
            (n.table.clone(), "reset_at"),
            (n.sliding.clone(), "expires_at"),
            (n.bucket.clone(), "expires_at"),
        ];
        let check = checked_answer();
        let single = |function: &str| {
            format!(
                "SELECT {check} FROM (SELECT set_config('lock_timeout', $6, true) AS s) AS cfg, \
                 LATERAL (SELECT {function}($1, $2, $3, $4, $5) AS r WHERE cfg.s IS NOT NULL OFFSET 0) AS x"
            )
        };
        Sql {
            create: schema::create_batch(n),
            single: [
                single(&n.fixed_fn),
                single(&n.sliding_fn),
                single(&n.bucket_fn),
            ],
            batch: std::array::from_fn(|kinds| batch_sql(n, kinds)),
            step: std::array::from_fn(|kinds| step_sql(n, kinds)),
            unlink: [&n.table, &n.sliding, &n.bucket].map(|t| {
                format!(
                    "DELETE FROM {t} WHERE key = $1 AND (SELECT set_config('lock_timeout', $2, true)) IS NOT NULL \
                     RETURNING 1"
                )
            }),
            reset_all: [&n.table, &n.sliding, &n.bucket].map(|t| {
                format!(
                    "WITH d AS (DELETE FROM {t} WHERE (SELECT set_config('lock_timeout', $1, true)) IS NOT NULL \
                     RETURNING 1) SELECT count(*) FROM d"
                )
            }),
            // Rows that count nothing: an ended window, a sliding state past its
            // end, a bucket full again. SKIP LOCKED: a row a call holds is left,
            // and the sweep never waits for a lock.
            sweep: tables.clone().map(|(t, column)| {
                format!(
                    "DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t} WHERE {column} < now() \
                     LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED))"
                )
            }),
            // Without that index (seed 000's table has none): one range of pages at a time
            // (a TID range scan), never the whole table in one statement.
            sweep_pages: tables.clone().map(|(t, column)| {
                format!(
                    "DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t} \
                     WHERE ctid >= format('(%s,0)', $1::int8)::tid AND ctid < format('(%s,0)', $2::int8)::tid \
                     AND {column} < now() FOR UPDATE SKIP LOCKED))"
                )
            }),
            has_index: "SELECT EXISTS (SELECT FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a \
                        ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                        WHERE i.indrelid = pg_catalog.to_regclass($1) AND a.attname = $2 AND i.indisvalid \
                        AND i.indpred IS NULL)"
                .into(),
            pages: "SELECT pg_catalog.pg_relation_size(pg_catalog.to_regclass($1)) \
                    / current_setting('block_size')::int8"
                .into(),
            tables,
            hit: hit_sql(&n.table),
            hits: hits_sql(&n.table),
        }
    }
}

/// The statement for a batch of calls of the algorithms in `kinds` (bit
/// [`Kind`]): each row of `unnest` one call, applied and answered in the
/// order of the rows (the lateral function call runs row by row, in the
/// order `unnest` gives them); `$8` is the statement's lock_timeout.
fn batch_sql(n: &Names, kinds: usize) -> String {
    calls_sql(n, kinds, false)
}

/// [`batch_sql`]'s statement, or (`step`) its rows `(i, r)` unordered, for [`step_sql`].
fn calls_sql(n: &Names, kinds: usize, step: bool) -> String {
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
    let (columns, order) = if step {
        (format!("u.i AS i, {} AS r", checked_answer()), "")
    } else {
        (checked_answer(), " ORDER BY u.i")
    };
    format!(
        "SELECT {columns} FROM (SELECT set_config('lock_timeout', $8, true) AS s) AS cfg, \
         unnest($1::int4[], $2::int4[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[]) \
         WITH ORDINALITY AS u(f, o, k, a, b, c, d, i), \
         LATERAL (SELECT {value} AS r WHERE cfg.s IS NOT NULL OFFSET 0) AS x{order}"
    )
}

/// The transaction-local setting a step's statement leaves for [`STEP_CHECK`]:
/// whether every take allowed.
const STEP_SETTING: &str = "ratestore.step_allowed";

/// A step's first statement: its takes as a batch's calls (in lock order),
/// each answer as the batch's, and [`STEP_SETTING`] set (for the
/// transaction alone) to whether every take allowed.
fn step_sql(n: &Names, kinds: usize) -> String {
    format!(
        "WITH t AS MATERIALIZED ({}) \
         SELECT t.r, set_config('{STEP_SETTING}', (SELECT bool_and(y.r[1] = 1)::text FROM t AS y), true) \
         FROM t ORDER BY t.i",
        calls_sql(n, kinds, true)
    )
}

/// A step's second statement: fails (22012, division by zero) when a take
/// refused, so that the transaction rolls back whole.
const STEP_CHECK: &str = "SELECT 1 / (current_setting('ratestore.step_allowed')::bool)::int4";

/// A run of a batch's calls on one key, and the sum of their amounts.
struct HitGroup {
    start: usize,
    end: usize,
    sum: i64,
}

/// `calls` as runs of one key, when each is a fixed window's hit of a
/// positive amount, a key's calls are together and in lock order (each
/// key after the one before), and each key's sum is a safe integer: then
/// they go as one upsert of their keys ([`hits_sql`]). None otherwise.
fn hit_groups(calls: &[&Encoded<'_>]) -> Option<Vec<HitGroup>> {
    let mut groups: Vec<HitGroup> = Vec::new();
    for (at, call) in calls.iter().enumerate() {
        if call.kind != Kind::Fixed || call.op != 0 || call.b <= 0 {
            return None;
        }
        match groups.last_mut() {
            Some(g) if calls[g.start].key == call.key => {
                g.sum += call.b;
                if g.sum > MAX_SAFE {
                    return None;
                }
                g.end = at + 1;
            }
            Some(g) if calls[g.start].key > call.key => return None,
            _ => groups.push(HitGroup {
                start: at,
                end: at + 1,
                sum: call.b,
            }),
        }
    }
    Some(groups)
}

/// An algorithm function's answer, `len` safe integers, checked.
fn answer(values: Option<Vec<i64>>, len: usize) -> Result<Answer> {
    match values {
        Some(v) if v.len() == len && v.iter().all(|n| n.abs() <= MAX_SAFE) => Ok(Answer::new(&v)),
        Some(v) if v.len() == len => Err(Error::CountOutOfRange),
        _ => Err(schema::wrong_shape()),
    }
}

/// A statement's failure: the error, and the SQLSTATE the server answered.
#[derive(Clone)]
pub(crate) struct Failure {
    pub error: Error,
    pub state: Option<String>,
}

/// One store's connections and statements.
pub struct PgStore {
    config: PgConfig,
    /// The statements, once the names are known (at once with a schema, else on the first connect).
    sql: std::sync::Mutex<Option<Arc<Sql>>>,
    /// The connections: 0 for the calls, 1 for the calls on keys whose rows
    /// another session holds, and the sweeper (with `connection_limit=1`,
    /// both use 0).
    lanes: [Mutex<Option<Arc<PgConn>>>; MAX_CONNECTIONS],
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
    /// The session's default isolation is not READ COMMITTED: each statement
    /// goes between `BEGIN ISOLATION LEVEL READ COMMITTED` and `COMMIT`
    /// (pipelined with it, in one round trip).
    wrap: AtomicBool,
    /// The sweeper's choice per table: whether it has an index on its end column.
    indexed: std::sync::Mutex<HashMap<usize, bool>>,
    /// No statement is prepared: the URL said `pgbouncer=true`, or a
    /// statement prepared on a connection was missing there (a transaction
    /// pooler sits between): see [`PgStore::exec`].
    pooled: AtomicBool,
}

/// A connection, and the statements prepared on it: SQL `PREPARE`d under
/// names of its own (`rs_`, a prefix no other connection's names share, a
/// number), so that a statement run on a session that is not this
/// connection's (behind a transaction pooler) finds no statement of that
/// name (26000) and runs nothing, never another's statement.
pub(crate) struct PgConn {
    client: Client,
    prefix: String,
    /// The name of each statement prepared here, by [`Stmt`]'s index.
    prepared: std::sync::Mutex<[Option<String>; STATEMENTS]>,
    next: std::sync::atomic::AtomicU32,
}

impl std::ops::Deref for PgConn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl PgConn {
    fn new(client: Client) -> PgConn {
        static CONNECTIONS: AtomicU64 = AtomicU64::new(0);
        let n = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        PgConn {
            client,
            prefix: format!("rs_{:x}_{nanos:x}_{n:x}", std::process::id()),
            prepared: std::sync::Mutex::new(Default::default()),
            next: std::sync::atomic::AtomicU32::new(0),
        }
    }

    fn prepared(&self, at: usize) -> Option<String> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner())[at].clone()
    }
}

/// Rows one sweep statement removes at most: each holds its rows' locks
/// for one short statement, and skips rows a call has locked.
const SWEEP_BATCH: u64 = 500;
/// Pages one sweep statement reads on a table without an index on its end column.
const SWEEP_PAGES: i64 = 256;
/// The pause between two statements of one sweep.
const SWEEP_PAUSE: Duration = Duration::from_millis(20);

/// The SQLSTATE of `e`, if the server answered it.
fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.as_db_error().map(|db| db.code().code())
}

/// A tokio-postgres error as a core error, its text cleaned of `secrets`.
fn pg_error(e: tokio_postgres::Error, secrets: &[&[u8]]) -> Error {
    let (code, text) = match e.as_db_error() {
        Some(db) if db.code().code() == codes::COUNT_RANGE => return Error::CountOutOfRange,
        Some(db)
            if db.code().code() == codes::INVALID_TEXT_REPRESENTATION
                && db.message().contains(COUNT_RANGE_MARK) =>
        {
            return Error::CountOutOfRange
        }
        // statement_timeout (or a cancel): the statement was rolled back, so the call counted nothing.
        Some(db) if db.code().code() == codes::QUERY_CANCELED => {
            return Error::Sql {
                store: Backend::Postgres,
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
        // lock_timeout: another session held the key's row past the call's time.
        Some(db) if db.code().code() == codes::LOCK_NOT_AVAILABLE => {
            return Error::Sql {
                store: Backend::Postgres,
                code: "ERR_TIMEOUT",
                text: format!(
                    "the key's row stayed locked by another session until the call's time ran out (55P03: {}); \
                     PostgreSQL rolled the call back: it was sent, counted nothing, and is not sent again",
                    db.message()
                ),
                sent: Some(true),
            }
            .redacted(secrets)
        }
        Some(db) => {
            let state = db.code().code();
            let code = if codes::auth(state) {
                "ERR_AUTH"
            } else if codes::connection_lost(state) {
                // The server ended the session (pg_terminate_backend, a shutdown, a crash) or is not
                // taking connections yet, or a connection exception: the connection is lost, as when
                // its socket closes.
                "ERR_CONNECTION"
            } else {
                "ERR_POSTGRES"
            };
            let hint = match state {
                codes::UNDEFINED_TABLE => " (the table is missing: create it with docs/postgres.sql, or leave createTable on)",
                codes::UNDEFINED_FUNCTION => " (the store's function is missing: create it with docs/postgres.sql, or leave createTable on)",
                codes::READ_ONLY_SQL_TRANSACTION => " (the server is read-only, e.g. a standby after a failover: the next call connects again)",
                s if codes::retryable(s) => " (the statement was rolled back: the call counted nothing)",
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
    Error::Sql {
        store: Backend::Postgres,
        code,
        text,
        sent: None,
    }
    .redacted(secrets)
}

/// A failure of a new connection's set-up (its connect, login, and the
/// statements that prepare it): the call was not sent.
fn unsent(e: Error) -> Error {
    match e {
        Error::Sql {
            store: Backend::Postgres,
            code,
            text,
            sent: None,
        } if code == "ERR_TIMEOUT" || code == "ERR_CONNECTION" => queue::with_sent(
            Error::Sql {
                store: Backend::Postgres,
                code,
                text,
                sent: None,
            },
            false,
        ),
        Error::Sql {
            store: Backend::Postgres,
            code,
            text,
            ..
        } => Error::Sql {
            store: Backend::Postgres,
            code,
            text: format!("{text} (while connecting: the call was not sent)"),
            sent: Some(false),
        },
        other => other,
    }
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
    sqlstate(e) == Some(codes::READ_ONLY_SQL_TRANSACTION)
}

/// Whether `e` is PostgreSQL's "relation does not exist".
fn undefined_table(e: &tokio_postgres::Error) -> bool {
    sqlstate(e) == Some(codes::UNDEFINED_TABLE)
}

type SqlParams<'a> = [(&'a (dyn ToSql + Sync), Type)];

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

    pub fn new(config: PgConfig, swept: Arc<AtomicU64>) -> PgStore {
        let sql = config.names.as_ref().map(|n| Arc::new(Sql::new(n)));
        let pooled = config.pooled;
        PgStore {
            config,
            sql: std::sync::Mutex::new(sql),
            lanes: std::array::from_fn(|_| Mutex::new(None)),
            queue: std::sync::Mutex::new(queue::Queue::default()),
            replace: AtomicBool::new(false),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            backoff: std::sync::Mutex::new(Backoff::new(
                u64::from(std::process::id()) ^ (Arc::as_ptr(&swept) as u64),
            )),
            swept,
            closed: AtomicBool::new(false),
            wrap: AtomicBool::new(false),
            indexed: std::sync::Mutex::new(HashMap::new()),
            pooled: AtomicBool::new(pooled),
        }
    }

    /// The statements (known once a connection resolved the names).
    fn sql(&self) -> Result<Arc<Sql>> {
        self.sql
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Internal(
                "a statement was made before the names were resolved",
            ))
    }

    /// How long a statement on the calls' connection waits for a row lock:
    /// a quarter of `timeoutMs`, so that a key another session holds is
    /// found, and moved to the second connection, well within the calls' time.
    pub(crate) fn lock_ms(&self) -> u64 {
        (self.config.timeout_ms / 4).clamp(1, i32::MAX as u64)
    }

    /// Starts the sweeper (unless `sweepIntervalMs` is 0): every interval,
    /// while the store is open and connected, it deletes expired rows in
    /// batches, on the second connection. It never opens the first
    /// connection on its own, and ends with the store.
    pub fn start_sweeper(store: &Arc<PgStore>, handle: &tokio::runtime::Handle) {
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
        let connected = match &*self.lanes[0].lock().await {
            Some(client) => !client.is_closed(),
            None => false,
        };
        if !connected {
            return Ok(0);
        }
        let client = self.client(MAX_CONNECTIONS - 1).await?;
        let sql = self.sql()?;
        let bound = Duration::from_millis(self.config.timeout_ms);
        let mut removed = 0;
        for (state, (table, column)) in sql.tables.iter().enumerate() {
            let indexed = self.indexed(&client, &sql, state, table, column).await;
            let indexed = match indexed {
                Ok(Some(indexed)) => indexed,
                Ok(None) => continue,
                Err(e) => return Err(e),
            };
            if indexed {
                loop {
                    let work = client.execute_typed(&sql.sweep[state], &[]);
                    let n = match tokio::time::timeout(bound, work).await {
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) if state > 0 && undefined_table(&e) => break,
                        Ok(Err(e)) => return Err(self.error(e)),
                        Err(_) => {
                            self.cancel(&client);
                            return Ok(removed);
                        }
                    };
                    removed += n;
                    self.swept.fetch_add(n, Ordering::Relaxed);
                    if n < SWEEP_BATCH || self.closed.load(Ordering::Relaxed) {
                        break;
                    }
                    tokio::time::sleep(SWEEP_PAUSE).await;
                }
                continue;
            }
            let pages = match client.query_typed(&sql.pages, &[(table, Type::TEXT)]).await {
                Ok(rows) => rows
                    .first()
                    .and_then(|r| r.try_get::<_, Option<i64>>(0).ok().flatten())
                    .unwrap_or(0),
                Err(e) => return Err(self.error(e)),
            };
            let mut from = 0i64;
            while from < pages && !self.closed.load(Ordering::Relaxed) {
                let to = from + SWEEP_PAGES;
                let params: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&from, Type::INT8), (&to, Type::INT8)];
                let work = client.execute_typed(&sql.sweep_pages[state], &params);
                let n = match tokio::time::timeout(bound, work).await {
                    Ok(Ok(n)) => n,
                    Ok(Err(e)) => return Err(self.error(e)),
                    Err(_) => {
                        self.cancel(&client);
                        return Ok(removed);
                    }
                };
                removed += n;
                self.swept.fetch_add(n, Ordering::Relaxed);
                from = to;
                tokio::time::sleep(SWEEP_PAUSE).await;
            }
        }
        Ok(removed)
    }

    /// Whether table `state` has an index on its end column (asked once);
    /// `None` for a state's table that does not exist.
    async fn indexed(
        &self,
        client: &PgConn,
        sql: &Sql,
        state: usize,
        table: &String,
        column: &'static str,
    ) -> Result<Option<bool>> {
        if let Some(&known) = self
            .indexed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&state)
        {
            return Ok(Some(known));
        }
        let column = column.to_string();
        let rows = client
            .query_typed(&sql.pages, &[(table, Type::TEXT)])
            .await
            .map_err(|e| self.error(e))?;
        if rows
            .first()
            .and_then(|r| r.try_get::<_, Option<i64>>(0).ok().flatten())
            .is_none()
        {
            return Ok(None);
        }
        let rows = client
            .query_typed(
                &sql.has_index,
                &[(table, Type::TEXT), (&column, Type::TEXT)],
            )
            .await
            .map_err(|e| self.error(e))?;
        let indexed = rows
            .first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .unwrap_or(false);
        self.indexed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(state, indexed);
        Ok(Some(indexed))
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

    fn failure(&self, e: tokio_postgres::Error) -> Failure {
        let state = sqlstate(&e).map(str::to_string);
        Failure {
            error: self.error(e),
            state,
        }
    }

    /// Asks the server to cancel what `client`'s backend runs (a statement
    /// that got no answer in time), so that it does not wait on.
    pub(crate) fn cancel(&self, client: &Client) {
        let token = client.cancel_token();
        let tls = self.config.tls.clone();
        tokio::spawn(async move {
            let _ = match tls {
                None => token.cancel_query(NoTls).await,
                Some(tls) => token.cancel_query(tls).await,
            };
        });
    }

    /// The open connection of `lane`, connecting (and creating the table)
    /// first if there is none or it was lost. One connect at a time per
    /// lane: the lock.
    ///
    /// After a failed connect, calls reject at once (unsent) for a delay
    /// that doubles with each failure in a row ([`Backoff`]); then the next
    /// call alone connects (the others, waiting on the lock, see its outcome).
    pub(crate) async fn client(&self, lane: usize) -> Result<Arc<PgConn>> {
        let lane = lane.min(self.config.connections - 1);
        let mut slot = self.lanes[lane].lock().await;
        if lane == 0 && self.replace.swap(false, Ordering::Relaxed) {
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
        let result = self.connect(lane).await;
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

    /// Drops `lane`'s connection if it is still `client` (it got no answer in time).
    pub(crate) async fn drop_client(&self, lane: usize, client: &Arc<PgConn>) {
        let lane = lane.min(self.config.connections - 1);
        let mut slot = self.lanes[lane].lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            slot.take();
        }
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection's set-up query: the session's default isolation, and
    /// the schema where the table's name resolves on the search path (the
    /// seed's table in `public` when a `"$user"` schema exists too), else the
    /// schema new tables go to (`current_schema()`).
    const SETUP: &'static str = "SELECT current_setting('transaction_isolation'), \
         coalesce((SELECT n.nspname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = pg_catalog.to_regclass($1)), pg_catalog.current_schema()::text)";

    /// The store's names: the configured schema's, else the schema the
    /// set-up query found: named explicitly from then on, so the store never
    /// makes a second table elsewhere.
    fn resolve(&self, found: Option<String>) -> Result<Arc<Sql>> {
        if let Ok(sql) = self.sql() {
            return Ok(sql);
        }
        let schema = found.ok_or_else(|| {
            config_error(
                "the table's schema can't be found: the table is on no schema of the search_path and the \
                 search_path names no schema that exists to create it in; pass { schema }",
            )
        })?;
        let sql = Arc::new(Sql::new(&Names::new(&self.config.table, Some(&schema))?));
        let mut slot = self.sql.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Arc::clone(slot.get_or_insert(sql)))
    }

    /// A new connection for `lane`, set up: the calls' connection makes the
    /// store's tables and functions on it (createTable).
    async fn connect(&self, lane: usize) -> Result<PgConn> {
        let setup = |e: tokio_postgres::Error| match e.as_db_error() {
            // A statement_timeout that cancelled the set-up: no call was sent.
            Some(db) if db.code().code() == codes::QUERY_CANCELED => queue::with_sent(
                Error::Sql {
                    store: Backend::Postgres,
                    code: "ERR_TIMEOUT",
                    text: format!(
                        "PostgreSQL cancelled the set-up of a new connection (57014: {})",
                        db.message()
                    ),
                    sent: None,
                }
                .redacted(&self.config.secrets()),
                false,
            ),
            _ => unsent(self.error(e)),
        };
        let client = match &self.config.tls {
            None => {
                let (client, connection) = self.config.pg.connect(NoTls).await.map_err(setup)?;
                tokio::spawn(connection);
                client
            }
            Some(tls) => {
                let (client, connection) =
                    self.config.pg.connect(tls.clone()).await.map_err(setup)?;
                tokio::spawn(connection);
                client
            }
        };
        let quoted = schema::quote(&self.config.table);
        let rows = client
            .query_typed(Self::SETUP, &[(&quoted, Type::TEXT)])
            .await
            .map_err(setup)?;
        let row = rows.first();
        let isolation: Option<String> = row.and_then(|r| r.try_get(0).ok());
        self.wrap.store(
            isolation.as_deref() != Some("read committed"),
            Ordering::Relaxed,
        );
        let sql = self
            .resolve(row.and_then(|r| r.try_get(1).ok()))
            .map_err(unsent)?;
        if self.config.create_table && lane == 0 {
            client.batch_execute(&sql.create).await.map_err(setup)?;
        }
        Ok(PgConn::new(client))
    }

    /// Runs `sql` on `client`, at READ COMMITTED whatever the session's default.
    async fn query(
        &self,
        client: &PgConn,
        sql: &str,
        params: &SqlParams<'_>,
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        if !self.wrap.load(Ordering::Relaxed) {
            return client.query_typed(sql, params).await;
        }
        let (begin, rows, commit) = futures_util::future::join3(
            client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
            client.query_typed(sql, params),
            client.batch_execute("COMMIT"),
        )
        .await;
        begin?;
        let rows = rows?;
        commit?;
        Ok(rows)
    }

    /// Runs statement `at` of `sql` on `conn` with `lits`, answering each
    /// row's values as `shape` reads them.
    ///
    /// Where no transaction pooler is known to sit between, the statement
    /// is prepared on the connection (an SQL `PREPARE` under the
    /// connection's own name, once) and run by `EXECUTE` of its arguments as
    /// literals, in one message (the simple query protocol): the server
    /// neither parses nor plans it again. Should the prepared statement be
    /// missing (26000: a transaction pooler gave the statement another
    /// server session; `EXECUTE` then ran nothing), the store goes on with
    /// unnamed statements, which any session runs, from then on: this one
    /// first. A session whose default isolation is not READ COMMITTED runs
    /// unnamed statements too ([`Self::query`]).
    async fn exec(
        &self,
        conn: &PgConn,
        sql: &Sql,
        at: usize,
        lits: &[Lit<'_>],
        shape: Shape,
    ) -> std::result::Result<Vec<Option<Vec<i64>>>, tokio_postgres::Error> {
        if !self.pooled.load(Ordering::Relaxed) && !self.wrap.load(Ordering::Relaxed) {
            let name = match conn.prepared(at) {
                Some(name) => name,
                None => {
                    let n = conn.next.fetch_add(1, Ordering::Relaxed);
                    let name = format!("{}_{n}", conn.prefix);
                    let text = format!("PREPARE {name} ({}) AS {}", Sql::types(at), sql.text(at));
                    conn.batch_execute(&text).await?;
                    conn.prepared.lock().unwrap_or_else(|e| e.into_inner())[at] =
                        Some(name.clone());
                    name
                }
            };
            let mut text = String::with_capacity(64 + name.len() + 16 * lits.len());
            text.push_str("EXECUTE ");
            text.push_str(&name);
            text.push('(');
            for (i, lit) in lits.iter().enumerate() {
                if i > 0 {
                    text.push_str(", ");
                }
                lit.write(&mut text);
            }
            text.push(')');
            match conn.simple_query(&text).await {
                Ok(messages) => {
                    return Ok(messages
                        .iter()
                        .filter_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(row) => {
                                Some(shape.read_text(row))
                            }
                            _ => None,
                        })
                        .collect())
                }
                Err(e) if sqlstate(&e) == Some(codes::INVALID_SQL_STATEMENT_NAME) => {
                    self.pooled.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let params: Vec<(&(dyn ToSql + Sync), Type)> = lits.iter().map(Lit::param).collect();
        let rows = self.query(conn, sql.text(at), &params).await?;
        Ok(rows.iter().map(|row| shape.read(row)).collect())
    }

    /// Runs one op within the store's timeout, in its place in the store's queue.
    pub async fn run(self: &Arc<Self>, op: Op, args: Args, key: String) -> Result<Answer> {
        let queued = self.queue_call(op, args, key)?;
        self.wait(queued).await
    }

    /// Queues one op in its place, now (see [`PgStore::enqueue`]): calls
    /// queued one after another in one task are queued in that order before
    /// any is sent; [`PgStore::wait`] answers it.
    pub fn queue_call(self: &Arc<Self>, op: Op, args: Args, key: String) -> Result<Queued> {
        if key.contains('\0') {
            return Err(Error::Sql {
                store: Backend::Postgres,
                code: "ERR_POSTGRES",
                text: "the key holds a NUL character, which PostgreSQL's text can't hold (22021); \
                       the call was not sent"
                    .into(),
                sent: Some(false),
            });
        }
        Ok(self.enqueue(Work::Call {
            op,
            args,
            key: stored_key(key),
        }))
    }

    /// Runs several takes as one step, in its place in the store's queue:
    /// every take made, or none. Answers each take's answer, in order (as
    /// it found its row when not every take allowed).
    pub async fn step(self: &Arc<Self>, takes: Vec<(Op, Args, String)>) -> Result<Vec<Answer>> {
        if takes.iter().any(|(_, _, key)| key.contains('\0')) {
            return Err(Error::Sql {
                store: Backend::Postgres,
                code: "ERR_POSTGRES",
                text: "a key holds a NUL character, which PostgreSQL's text can't hold (22021); \
                       the step was not sent"
                    .into(),
                sent: Some(false),
            });
        }
        let work = Arc::new(StepWork {
            takes: takes
                .into_iter()
                .map(|(op, args, key)| (op, args, stored_key(key)))
                .collect(),
            answers: std::sync::Mutex::new(None),
        });
        self.submit(Work::Step(Arc::clone(&work))).await?;
        let answers = work
            .answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(Error::Internal("a step ran without answers"))?;
        answers.into_iter().collect()
    }

    /// A step's takes in one transaction, pipelined in one round trip:
    /// `BEGIN`, the takes as a batch's calls (their rows locked by table,
    /// then key, as a batch's), a statement that fails when one refused,
    /// `COMMIT` (then a rollback: nothing of the step applied). Each row
    /// waits at most `lock_ms`; a deadlock or a serialization failure
    /// (nothing applied) is tried again. Leaves the answers in `step`.
    async fn run_step(
        &self,
        client: &PgConn,
        step: &StepWork,
        lock_ms: u64,
    ) -> std::result::Result<(), Failure> {
        let sql = self.sql().map_err(|error| Failure { error, state: None })?;
        let calls = step
            .takes
            .iter()
            .map(|(op, args, key)| Encoded::new(*op, args, key))
            .collect::<Option<Vec<_>>>()
            .ok_or(Failure {
                error: Error::InvalidRange("a step's take must be a consume or a token bucket"),
                state: None,
            })?;
        let mut order: Vec<usize> = (0..calls.len()).collect();
        order.sort_by(|&i, &j| {
            (calls[i].kind as u8, calls[i].key).cmp(&(calls[j].kind as u8, calls[j].key))
        });
        let mut kinds = 0;
        let (mut f, mut o, mut k) = (Vec::new(), Vec::new(), Vec::new());
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &i in &order {
            let call = &calls[i];
            kinds |= 1 << call.kind as usize;
            f.push(call.kind as i32);
            o.push(call.op);
            k.push(call.key);
            a.push(call.a);
            b.push(call.b);
            c.push(call.c);
            d.push(call.d);
        }
        let lock = lock_ms.to_string();
        let params: [(&(dyn ToSql + Sync), Type); 8] = [
            (&f, Type::INT4_ARRAY),
            (&o, Type::INT4_ARRAY),
            (&k, Type::TEXT_ARRAY),
            (&a, Type::INT8_ARRAY),
            (&b, Type::INT8_ARRAY),
            (&c, Type::INT8_ARRAY),
            (&d, Type::INT8_ARRAY),
            (&lock, Type::TEXT),
        ];
        let mut tries = 0;
        let rows = loop {
            let (begin, rows, check, commit) = futures_util::future::join4(
                client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
                client.query_typed(&sql.step[kinds], &params),
                client.query_typed(STEP_CHECK, &[]),
                client.batch_execute("COMMIT"),
            )
            .await;
            let outcome = (|| {
                begin.map_err(|e| self.failure(e))?;
                let rows = rows.map_err(|e| self.failure(e))?;
                match check {
                    Ok(_) => {}
                    // A take refused: the transaction rolled back.
                    Err(e) if sqlstate(&e) == Some(codes::DIVISION_BY_ZERO) => {}
                    Err(e) => return Err(self.failure(e)),
                }
                commit.map_err(|e| self.failure(e))?;
                Ok(rows)
            })();
            match outcome {
                Err(f) if f.state.as_deref().is_some_and(codes::retryable) && tries < 3 => {
                    tries += 1;
                }
                Err(f) => return Err(f),
                Ok(rows) => break rows,
            }
        };
        if rows.len() != calls.len() {
            return Err(Failure {
                error: schema::wrong_shape(),
                state: None,
            });
        }
        let mut answers: Vec<Option<Result<Answer>>> = (0..calls.len()).map(|_| None).collect();
        for (row, &at) in rows.iter().zip(&order) {
            answers[at] = Some(answer(row.try_get(0).ok(), calls[at].len));
        }
        let answers = answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(schema::wrong_shape())))
            .collect();
        *step.answers.lock().unwrap_or_else(|e| e.into_inner()) = Some(answers);
        Ok(())
    }

    /// Calls of one algorithm's functions as one statement (one alone as its
    /// own short statement), each waiting at most `lock_ms` for a row lock;
    /// a deadlock or a serialization failure (nothing applied) is tried again.
    async fn run_calls(
        &self,
        client: &PgConn,
        calls: &[&Encoded<'_>],
        lock_ms: u64,
    ) -> std::result::Result<Vec<Result<Answer>>, Failure> {
        let sql = self.sql().map_err(|error| Failure { error, state: None })?;
        let lock = lock_ms.to_string();
        let mut tries = 0;
        loop {
            let outcome = match calls {
                [call] => self
                    .run_one(client, &sql, call, &lock)
                    .await
                    .map(|a| vec![a]),
                _ => match hit_groups(calls) {
                    Some(groups) => self.run_hits(client, &sql, calls, &groups, &lock).await,
                    None => self.run_batch(client, &sql, calls, &lock).await,
                },
            };
            match outcome {
                Err(f) if f.state.as_deref().is_some_and(codes::retryable) && tries < 3 => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    async fn run_one(
        &self,
        client: &PgConn,
        sql: &Sql,
        call: &Encoded<'_>,
        lock: &str,
    ) -> std::result::Result<Result<Answer>, Failure> {
        // The fixed window's hit of a positive amount: its upsert.
        let hit = call.kind == Kind::Fixed && call.op == 0 && call.b > 0;
        let lits = if hit {
            vec![
                Lit::Text(call.key),
                Lit::I64(call.b),
                Lit::I64(call.a),
                Lit::Text(lock),
            ]
        } else {
            match call.kind {
                Kind::Fixed | Kind::Sliding => vec![
                    Lit::I32(call.op),
                    Lit::Text(call.key),
                    Lit::I64(call.a),
                    Lit::I64(call.b),
                    Lit::I64(call.c),
                    Lit::Text(lock),
                ],
                Kind::Bucket => vec![
                    Lit::Text(call.key),
                    Lit::I64(call.a),
                    Lit::I64(call.b),
                    Lit::I64(call.c),
                    Lit::I64(call.d),
                    Lit::Text(lock),
                ],
            }
        };
        let (at, shape) = if hit {
            (HIT_AT, Shape::Pair)
        } else {
            (call.kind as usize, Shape::Array)
        };
        let rows = self
            .exec(client, sql, at, &lits, shape)
            .await
            .map_err(|e| self.failure(e))?;
        Ok(answer(rows.into_iter().next().flatten(), call.len))
    }

    /// `calls`, fixed-window hits of positive amounts in `groups` of one
    /// key ([`hit_groups`]), as one upsert of their keys ([`hits_sql`]).
    async fn run_hits(
        &self,
        client: &PgConn,
        sql: &Sql,
        calls: &[&Encoded<'_>],
        groups: &[HitGroup],
        lock: &str,
    ) -> std::result::Result<Vec<Result<Answer>>, Failure> {
        let keys: Vec<&str> = groups.iter().map(|g| calls[g.start].key).collect();
        let sums: Vec<i64> = groups.iter().map(|g| g.sum).collect();
        let windows: Vec<i64> = groups.iter().map(|g| calls[g.start].a).collect();
        let lits = [
            Lit::Texts(&keys),
            Lit::I64s(&sums),
            Lit::I64s(&windows),
            Lit::Text(lock),
        ];
        let rows = self
            .exec(client, sql, HITS_AT, &lits, Shape::Triple)
            .await
            .map_err(|e| self.failure(e))?;
        let wrong = || Failure {
            error: schema::wrong_shape(),
            state: None,
        };
        if rows.len() != groups.len() {
            return Err(wrong());
        }
        let mut answers = Vec::with_capacity(calls.len());
        for (at, (row, group)) in rows.into_iter().zip(groups).enumerate() {
            let Some([i, count, reset]) = row.as_deref().and_then(|r| <[i64; 3]>::try_from(r).ok())
            else {
                return Err(wrong());
            };
            if i != at as i64 + 1 {
                return Err(wrong());
            }
            let mut running = count - group.sum;
            for call in &calls[group.start..group.end] {
                running += call.b;
                answers.push(answer(Some(vec![running, reset]), call.len));
            }
        }
        Ok(answers)
    }

    async fn run_batch(
        &self,
        client: &PgConn,
        sql: &Sql,
        calls: &[&Encoded<'_>],
        lock: &str,
    ) -> std::result::Result<Vec<Result<Answer>>, Failure> {
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
        let lits = [
            Lit::I32s(&f),
            Lit::I32s(&o),
            Lit::Texts(&k),
            Lit::I64s(&a),
            Lit::I64s(&b),
            Lit::I64s(&c),
            Lit::I64s(&d),
            Lit::Text(lock),
        ];
        let rows = self
            .exec(client, sql, BATCH_AT + kinds, &lits, Shape::Array)
            .await
            .map_err(|e| self.failure(e))?;
        if rows.len() != calls.len() {
            return Err(Failure {
                error: schema::wrong_shape(),
                state: None,
            });
        }
        Ok(rows
            .into_iter()
            .zip(calls)
            .map(|(row, call)| answer(row, call.len))
            .collect())
    }

    /// A call that is not an algorithm's (`reset`, `ping`), waiting at most
    /// `lock_ms` for a row lock.
    async fn run_op(
        &self,
        client: &PgConn,
        op: Op,
        args: &Args,
        key: &str,
        lock_ms: u64,
    ) -> std::result::Result<Answer, Failure> {
        let lock = lock_ms.to_string();
        match op {
            Op::Unlink => {
                let sql = self.sql().map_err(|error| Failure { error, state: None })?;
                let state = args[0] as usize;
                let params: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&key, Type::TEXT), (&lock, Type::TEXT)];
                match self.query(client, &sql.unlink[state], &params).await {
                    Ok(rows) => Ok(Answer::new(&[rows.len() as i64])),
                    // A state's table that was never created (createTable: false) holds nothing.
                    Err(e) if state > 0 && undefined_table(&e) => Ok(Answer::new(&[0])),
                    Err(e) => Err(self.failure(e)),
                }
            }
            _ => {
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| self.failure(e))?;
                Ok(Answer::new(&[1]))
            }
        }
    }

    /// Deletes every counter and state of the store's tables, in its place in the queue.
    pub async fn reset_all(self: &Arc<Self>) -> Result<()> {
        self.submit(Work::ResetAll).await.map(|_| ())
    }

    async fn reset_all_on(
        &self,
        client: &PgConn,
        lock_ms: u64,
    ) -> std::result::Result<(), Failure> {
        let sql = self.sql().map_err(|error| Failure { error, state: None })?;
        let lock = lock_ms.to_string();
        for (state, statement) in sql.reset_all.iter().enumerate() {
            let params: [(&(dyn ToSql + Sync), Type); 1] = [(&lock, Type::TEXT)];
            let mut tries = 0;
            loop {
                match self.query(client, statement, &params).await {
                    Ok(_) => break,
                    Err(e) if state > 0 && undefined_table(&e) => break,
                    Err(e) if sqlstate(&e).is_some_and(codes::retryable) && tries < 3 => tries += 1,
                    Err(e) => return Err(self.failure(e)),
                }
            }
        }
        Ok(())
    }

    /// Drops the connections (calls in flight fail).
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        for lane in &self.lanes {
            lane.lock().await.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_url_names_the_variables() {
        let err = PgConfig::resolve(&PgOptions::default(), |_| None)
            .err()
            .unwrap();
        assert_eq!(err.code(), "ERR_CONFIG");
        assert!(err.to_string().contains("DATABASE_URL"));
        assert!(err.to_string().contains("POSTGRES_URL"));
    }

    #[test]
    fn the_url_option_wins_then_database_url() {
        let env = |name: &str| (name == "POSTGRES_URL").then(|| "postgres://u@h:1/b".to_string());
        let config = PgConfig::resolve(&PgOptions::default(), env).ok().unwrap();
        assert_eq!(config.pg.get_dbname(), Some("b"));
        let both = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://u@h:1/first".to_string()),
            _ => Some("postgres://u@h:1/second".to_string()),
        };
        let config = PgConfig::resolve(&PgOptions::default(), both).ok().unwrap();
        assert_eq!(config.pg.get_dbname(), Some("first"));
    }

    #[test]
    fn names_are_quoted() {
        let options = PgOptions {
            url: Some("postgres://u@h/b".into()),
            table: Some("we\"ird".into()),
            schema: Some("s".into()),
            ..PgOptions::default()
        };
        let config = PgConfig::resolve(&options, |_| None).ok().unwrap();
        assert_eq!(config.names.unwrap().table, "\"s\".\"we\"\"ird\"");
    }

    #[test]
    fn pg_and_prisma_parameters_are_taken_with_a_meaning() {
        let (rest, extra) = split_extra(
            "postgres://u@h/b?pgbouncer=true&connection_limit=1&uselibpqcompat=true&pool_timeout=10&schema=my%20s&ssl=true&application_name=a",
        )
        .ok()
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u@h/b?application_name=a&sslmode=verify-full"
        );
        assert_eq!(extra.connections, Some(1));
        assert_eq!(extra.schema.as_deref(), Some("my s"));
        assert!(extra.pooled);
        let (_, extra) = split_extra("postgres://u@h/b?pgbouncer=false")
            .ok()
            .unwrap();
        assert!(!extra.pooled);
        let (rest, _) = split_extra("postgres://u@h/b?ssl=true&sslmode=no-verify")
            .ok()
            .unwrap();
        assert_eq!(rest, "postgres://u@h/b?sslmode=require");
        let (_, extra) = split_extra("postgres://u@h/b?connection_limit=9")
            .ok()
            .unwrap();
        assert_eq!(extra.connections, Some(MAX_CONNECTIONS));
        assert!(split_extra("postgres://u@h/b?pgbouncer=maybe").is_err());
        assert!(split_extra("postgres://u@h/b?connection_limit=0").is_err());
    }

    #[test]
    fn an_unknown_parameter_is_named_and_no_value_is_shown() {
        let err = PgConfig::resolve(
            &PgOptions {
                url: Some("postgres://u:secret@h/b?application_name=a&frobnicate=secret".into()),
                ..PgOptions::default()
            },
            |_| None,
        )
        .err()
        .unwrap();
        assert_eq!(err.code(), "ERR_CONFIG");
        assert!(err.to_string().contains("\"frobnicate\""), "{err}");
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn literals_quote_text_in_the_escape_form_and_write_arrays() {
        let written = |lit: Lit<'_>| {
            let mut out = String::new();
            lit.write(&mut out);
            out
        };
        assert_eq!(written(Lit::Text(r"a'b\c")), r"E'a''b\\c'");
        assert_eq!(written(Lit::I64(-5)), "-5");
        assert_eq!(written(Lit::I32s(&[1, -2])), "'{1,-2}'");
        assert_eq!(written(Lit::I64s(&[])), "'{}'");
        assert_eq!(
            written(Lit::Texts(&["x", "{y,'}"])),
            r"ARRAY[E'x',E'{y,''}']"
        );
        assert_eq!(written(Lit::Texts(&[])), "'{}'");
    }

    #[test]
    fn hit_sql_names_the_table_and_the_range_mark() {
        let sql = hit_sql("\"s\".\"t\"");
        assert!(sql.contains("INSERT INTO \"s\".\"t\" AS c"));
        assert!(sql.contains(COUNT_RANGE_MARK));
        assert!(sql.contains(&MAX_SAFE.to_string()));
    }

    #[test]
    fn hits_go_as_one_upsert_only_when_each_is_a_positive_fixed_window_hit_in_key_order() {
        let call = |key: &'static str, op: Op, amount: i64| {
            Encoded::new(op, &[60_000, amount, 0, 0], key).unwrap()
        };
        let (a1, a2, b, c) = (
            call("a", Op::Hit, 1),
            call("a", Op::Hit, 2),
            call("b", Op::Hit, 3),
            call("c", Op::Hit, 4),
        );
        let groups = hit_groups(&[&a1, &a2, &b, &c]).unwrap();
        let runs: Vec<(usize, usize, i64)> =
            groups.iter().map(|g| (g.start, g.end, g.sum)).collect();
        assert_eq!(runs, [(0, 2, 3), (2, 3, 3), (3, 4, 4)]);
        // Out of lock order, a key's hits apart, a read, a refund or a consume, a sum past the safe range: not.
        assert!(hit_groups(&[&b, &a1]).is_none());
        assert!(hit_groups(&[&a1, &b, &a2]).is_none());
        assert!(hit_groups(&[&a1, &call("b", Op::Hit, 0)]).is_none());
        assert!(hit_groups(&[&a1, &call("b", Op::Refund, 1)]).is_none());
        assert!(hit_groups(&[&a1, &call("b", Op::Consume, 1)]).is_none());
        let big = call("d", Op::Hit, MAX_SAFE);
        assert!(hit_groups(&[&big, &call("d", Op::Hit, 1)]).is_none());
        assert_eq!(hit_groups(&[&a1, &big]).map(|g| g.len()), Some(2));
    }

    #[test]
    fn hits_sql_answers_each_key_s_place_count_and_reset() {
        let sql = hits_sql("\"s\".\"t\"");
        assert!(sql.contains("INSERT INTO \"s\".\"t\" AS c"));
        assert!(sql.contains(COUNT_RANGE_MARK));
        assert!(sql.ends_with("ORDER BY u.i"));
        assert_eq!(sql.matches("ON CONFLICT (key)").count(), 1);
    }

    #[test]
    fn long_keys_are_stored_by_their_sha256_longer_than_any_plain_key() {
        let short = "k".repeat(MAX_PLAIN_KEY_BYTES);
        assert_eq!(stored_key(short.clone()), short);
        let a = stored_key(format!("{short}a"));
        let b = stored_key(format!("{short}b"));
        assert_ne!(a, b);
        assert!(a.len() > MAX_PLAIN_KEY_BYTES && a.len() < 1100);
        // Cut at a character's boundary.
        let wide = stored_key("\u{e9}".repeat(MAX_PLAIN_KEY_BYTES));
        assert!(wide.starts_with(&"\u{e9}".repeat(MAX_PLAIN_KEY_BYTES / 2)));
    }
}
