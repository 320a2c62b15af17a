//! The one error type of the core. Messages never contain a key, a URL or a
//! credential: they are built from constant text, numbers, and text from
//! outside (server or system messages) that [`Error::redacted`] has cleaned.

/// Which JavaScript class an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsClass {
    Error,
    TypeError,
    RangeError,
}

/// Which SQL store an [`Error::Sql`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
    Mysql,
}

impl Backend {
    /// The store's name, as its messages begin.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgresStore",
            Backend::Sqlite => "sqliteStore",
            Backend::Mysql => "mysqlStore",
        }
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// An argument of the wrong type (only reachable by bypassing the JS face).
    #[error("{0}")]
    InvalidType(&'static str),
    /// An argument of the right type but outside its range.
    #[error("{0}")]
    InvalidRange(&'static str),
    /// The hit would take the count outside the safe-integer range.
    #[error("the count would leave the safe-integer range (±(2^53 - 1)); nothing was changed")]
    CountOutOfRange,
    /// memoryStore is full and only long windows (token budgets) remain.
    #[error(
        "memoryStore is full ({0} counters) and every counter left belongs to a window longer than one hour; \
         raise maxKeys or use redisStore()"
    )]
    StoreFull(usize),
    /// A `memoryStore({ name })` of this name exists with another maxKeys.
    #[error(
        "memoryStore: a store of this name already exists with maxKeys {0}; every memoryStore({{ name }}) \
         of one name must pass the same maxKeys (or close() the other first)"
    )]
    NameConflict(usize),
    /// redisStore's settings (options, environment, URL) can't be used.
    #[error("redisStore: {0}")]
    Config(String),
    /// No answer within timeoutMs: while connecting (`sent` false: the hit
    /// did not count), or after the hit was sent (it may have counted).
    #[error("redisStore: {}", timeout_text(*ms, *sent))]
    Timeout { ms: u64, sent: bool },
    /// Could not connect (`sent` false), or the connection failed while the
    /// hit was under way (`sent` true).
    #[error("redisStore: {text}")]
    Connection { text: String, sent: bool },
    /// Connects failed lately (`cause` is the last failure), so for a while
    /// calls reject at once, unsent, and one connect at a time is tried.
    #[error("{cause}; backing off after {failures} failed connects: calls reject at once, unsent, {}", retry_text(*retry_ms))]
    BackingOff {
        cause: Box<Error>,
        failures: u32,
        retry_ms: u64,
    },
    /// Redis refused the credentials.
    #[error("redisStore: Redis refused the credentials ({0}); check the password or token")]
    Auth(String),
    /// Any other error answered by Redis.
    #[error("redisStore: Redis answered with an error: {0}")]
    Redis(String),
    /// A SQL store's failures (postgresStore, sqliteStore, mysqlStore:
    /// `store`, which names it in the message): `code` is the JS code
    /// (ERR_CONFIG, ERR_TIMEOUT, ERR_CONNECTION, ERR_AUTH, or the store's
    /// own for any other server error: ERR_POSTGRES, ERR_SQLITE, ERR_MYSQL);
    /// `sent`, where known, whether the call may have counted.
    #[error("{}: {text}", store.name())]
    Sql {
        store: Backend,
        code: &'static str,
        text: String,
        sent: Option<bool>,
    },
    /// A Redis Cluster node answered MOVED or ASK (`asking`): the call did
    /// not run; it belongs on the node at `to` (`host:port`). The cluster
    /// sends it there; past its redirections, it rejects with this.
    #[error("redisStore: Redis answered with an error: {} {slot} {to}", if *asking { "ASK" } else { "MOVED" })]
    Redirected {
        slot: String,
        to: String,
        asking: bool,
    },
    /// Redis's script cache was flushed while this call was on its way
    /// (NOSCRIPT: it did not run), and a later call on the same key ran
    /// first: sent again, it would take effect after that one, so it is not.
    #[error(
        "redisStore: Redis's script cache was flushed while this call was on its way and a later call on the same key \
         ran first; this call did not run (nothing was counted) and is not sent again, so calls on one key never take \
         effect out of order"
    )]
    Overtaken,
    /// With `waitForReplicas`: the call ran on the master, but fewer
    /// replicas than asked confirmed it (Redis `WAIT`) within `ms`, so a
    /// failover now could lose it; no answer is given for it.
    #[error(
        "redisStore: the call ran on the master, but only {acked} of the {wanted} replicas that waitForReplicas asks \
         for confirmed it within {ms} ms; it counted there, and a failover may lose it"
    )]
    Unconfirmed { acked: i64, wanted: u32, ms: u64 },
    /// With `waitForReplicas`: the call ran on the master, but Redis
    /// refused the `WAIT` after it (`NOPERM`: the ACL user lacks `wait`; a
    /// demoted master), so no replica is known to have it.
    #[error(
        "redisStore: the call ran on the master, but Redis refused the WAIT that waitForReplicas sends after it \
         ({text}){}; it counted there, and a failover may lose it",
        if *noperm { ": the ACL user needs the wait command (+wait)" } else { "" }
    )]
    WaitRefused { text: String, noperm: bool },
    /// The store was closed by `close()`.
    #[error("the store is closed; calls after close() are refused")]
    Closed,
    /// A Node-API call failed, with Node-API's own message for it.
    #[error("a Node-API call failed: {0}")]
    NodeApi(String),
    /// The JavaScript runtime lacks something the binding needs.
    #[error("{0}")]
    Unsupported(&'static str),
    /// Something the store can't explain: a bug, reported instead of a count.
    #[error("internal error in ratestore: {0}")]
    Internal(&'static str),
}

impl Error {
    /// The `code` property of the JavaScript error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidType(_) => "ERR_INVALID_ARG_TYPE",
            Error::InvalidRange(_) => "ERR_OUT_OF_RANGE",
            Error::CountOutOfRange => "ERR_COUNT_RANGE",
            Error::StoreFull(_) => "ERR_STORE_FULL",
            Error::NameConflict(_) => "ERR_STORE_NAME_CONFLICT",
            Error::Config(_) => "ERR_CONFIG",
            Error::Timeout { .. } => "ERR_TIMEOUT",
            Error::Connection { .. } => "ERR_CONNECTION",
            Error::BackingOff { cause, .. } => cause.code(),
            Error::Auth(_) => "ERR_AUTH",
            Error::Redis(_)
            | Error::Redirected { .. }
            | Error::Overtaken
            | Error::Unconfirmed { .. }
            | Error::WaitRefused { .. } => "ERR_REDIS",
            Error::Sql { code, .. } => code,
            Error::Closed => "ERR_CLOSED",
            Error::NodeApi(_) | Error::Internal(_) => "ERR_INTERNAL",
            Error::Unsupported(_) => "ERR_UNSUPPORTED",
        }
    }

    pub fn js_class(&self) -> JsClass {
        match self {
            Error::InvalidType(_) => JsClass::TypeError,
            Error::InvalidRange(_) | Error::CountOutOfRange => JsClass::RangeError,
            Error::BackingOff { cause, .. } => cause.js_class(),
            _ => JsClass::Error,
        }
    }

    /// The `sent` property of the JavaScript error, on `ERR_TIMEOUT` and
    /// `ERR_CONNECTION`: whether the hit left the process (and so may have
    /// counted).
    pub fn sent(&self) -> Option<bool> {
        match self {
            Error::Timeout { sent, .. } | Error::Connection { sent, .. } => Some(*sent),
            Error::Sql { sent, .. } => *sent,
            // It met NOSCRIPT and was not sent again.
            Error::Overtaken => Some(false),
            // It ran on the master.
            Error::Unconfirmed { .. } | Error::WaitRefused { .. } => Some(true),
            // A refused hit was never sent, whatever the failure that
            // started the backoff says of its own hits (a connection lost
            // with hits on it: sent: true); a cause that says nothing of
            // sent (ERR_AUTH, a demotion) still says nothing.
            Error::BackingOff { cause, .. } => cause.sent().map(|_| false),
            _ => None,
        }
    }

    /// The same error with every occurrence of each secret in its text replaced:
    /// the last guard before text from outside reaches a message.
    pub fn redacted(self, secrets: &[&[u8]]) -> Error {
        let clean = |text: String| redact(text, secrets);
        match self {
            Error::Config(t) => Error::Config(clean(t)),
            Error::Connection { text, sent } => Error::Connection {
                text: clean(text),
                sent,
            },
            Error::BackingOff {
                cause,
                failures,
                retry_ms,
            } => Error::BackingOff {
                cause: Box::new(cause.redacted(secrets)),
                failures,
                retry_ms,
            },
            Error::Auth(t) => Error::Auth(clean(t)),
            Error::Redis(t) => Error::Redis(clean(t)),
            Error::WaitRefused { text, noperm } => Error::WaitRefused {
                text: clean(text),
                noperm,
            },
            Error::Sql {
                store,
                code,
                text,
                sent,
            } => Error::Sql {
                store,
                code,
                text: clean(text),
                sent,
            },
            other => other,
        }
    }
}

fn timeout_text(ms: u64, sent: bool) -> String {
    match sent {
        true => format!(
            "no answer from Redis within {ms} ms; the call was sent, is not sent again, and may or may not have counted"
        ),
        false => format!(
            "no connection to Redis within {ms} ms; the call was not sent, so it did not count"
        ),
    }
}

fn retry_text(ms: u64) -> String {
    match ms {
        0 => "while a connect is tried".to_string(),
        ms => format!("for {ms} ms more, then one connect is tried"),
    }
}

fn redact(mut text: String, secrets: &[&[u8]]) -> String {
    for secret in secrets {
        // Empty or one-byte secrets would blank out every message; they match anyway.
        let Ok(secret) = std::str::from_utf8(secret) else {
            continue;
        };
        if secret.len() > 1 && text.contains(secret) {
            text = text.replace(secret, "[redacted]");
        }
    }
    text
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_codes() {
        assert_eq!(Error::CountOutOfRange.js_class(), JsClass::RangeError);
        assert_eq!(Error::StoreFull(3).code(), "ERR_STORE_FULL");
        assert_eq!(Error::InvalidType("x").js_class(), JsClass::TypeError);
        assert!(Error::StoreFull(3).to_string().contains("3 counters"));
        let sent = Error::Timeout { ms: 5, sent: true };
        assert_eq!((sent.code(), sent.sent()), ("ERR_TIMEOUT", Some(true)));
        let unsent = Error::Timeout { ms: 5, sent: false };
        assert_eq!(unsent.sent(), Some(false));
        assert!(unsent.to_string().contains("not sent, so it did not count"));
        assert!(sent.to_string().contains("may or may not have counted"));
        assert_eq!(Error::Closed.js_class(), JsClass::Error);
        assert_eq!(Error::Auth("WRONGPASS".into()).code(), "ERR_AUTH");
        let timeout = Error::Timeout {
            ms: 250,
            sent: true,
        };
        assert!(timeout.to_string().contains("250 ms"));
        assert_eq!(Error::Closed.sent(), None);
    }

    #[test]
    fn backing_off_keeps_the_cause_code() {
        let cause = Error::Auth("WRONGPASS hunter2".into());
        let e = Error::BackingOff {
            cause: Box::new(cause),
            failures: 3,
            retry_ms: 400,
        };
        assert_eq!(
            (e.code(), e.js_class(), e.sent()),
            ("ERR_AUTH", JsClass::Error, None)
        );
        let text = e.redacted(&[b"hunter2"]).to_string();
        assert!(
            text.starts_with("redisStore: Redis refused the credentials (WRONGPASS [redacted])"),
            "{text}"
        );
        assert!(
            text.contains("backing off after 3 failed connects"),
            "{text}"
        );
        assert!(text.contains("for 400 ms more"), "{text}");
    }

    #[test]
    fn a_backoff_refusal_is_never_sent_whatever_its_cause_says() {
        // A connection lost with calls on it says sent: true of those calls, not of the refused one.
        let cause = Error::Connection {
            text: "the connection to Redis failed".into(),
            sent: true,
        };
        let e = Error::BackingOff {
            cause: Box::new(cause),
            failures: 1,
            retry_ms: 80,
        };
        assert_eq!((e.code(), e.sent()), ("ERR_CONNECTION", Some(false)));
        let timeout = Error::BackingOff {
            cause: Box::new(Error::Timeout { ms: 5, sent: true }),
            failures: 2,
            retry_ms: 80,
        };
        assert_eq!(timeout.sent(), Some(false));
    }

    #[test]
    fn secrets_are_redacted_from_outside_text() {
        let e = Error::Redis("ERR key203.0.113.7 and hunter2".into());
        let e = e.redacted(&[b"203.0.113.7", b"hunter2", b""]);
        assert_eq!(
            e.to_string(),
            "redisStore: Redis answered with an error: ERR key[redacted] and [redacted]"
        );
        assert_eq!(Error::Closed.redacted(&[b"x"]), Error::Closed);
    }
}
