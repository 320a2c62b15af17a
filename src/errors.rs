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
    /// redisStore's settings (options, environment, URL) can't be used.
    #[error("redisStore: {0}")]
    Config(String),
    /// No answer within timeoutMs. A hit that was sent may have counted.
    #[error(
        "redisStore: no answer from Redis within {0} ms; the hit was not sent again and may or may not have counted"
    )]
    Timeout(u64),
    /// Could not connect, or the connection failed while the hit was under way.
    #[error("redisStore: {0}")]
    Connection(String),
    /// Redis refused the credentials.
    #[error("redisStore: Redis refused the credentials ({0}); check the password or token")]
    Auth(String),
    /// Any other error answered by Redis.
    #[error("redisStore: Redis answered with an error: {0}")]
    Redis(String),
    /// The store was closed by `close()`.
    #[error("redisStore: the store is closed; hits after close() are refused")]
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
            Error::Config(_) => "ERR_CONFIG",
            Error::Timeout(_) => "ERR_TIMEOUT",
            Error::Connection(_) => "ERR_CONNECTION",
            Error::Auth(_) => "ERR_AUTH",
            Error::Redis(_) => "ERR_REDIS",
            Error::Closed => "ERR_CLOSED",
            Error::NodeApi(_) | Error::Internal(_) => "ERR_INTERNAL",
            Error::Unsupported(_) => "ERR_UNSUPPORTED",
        }
    }

    pub fn js_class(&self) -> JsClass {
        match self {
            Error::InvalidType(_) => JsClass::TypeError,
            Error::InvalidRange(_) | Error::CountOutOfRange => JsClass::RangeError,
            _ => JsClass::Error,
        }
    }

    /// The same error with every occurrence of each secret in its text replaced:
    /// the last guard before text from outside reaches a message.
    pub fn redacted(self, secrets: &[&[u8]]) -> Error {
        let clean = |text: String| redact(text, secrets);
        match self {
            Error::Config(t) => Error::Config(clean(t)),
            Error::Connection(t) => Error::Connection(clean(t)),
            Error::Auth(t) => Error::Auth(clean(t)),
            Error::Redis(t) => Error::Redis(clean(t)),
            other => other,
        }
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
        assert_eq!(Error::Timeout(5).code(), "ERR_TIMEOUT");
        assert_eq!(Error::Closed.js_class(), JsClass::Error);
        assert_eq!(Error::Auth("WRONGPASS".into()).code(), "ERR_AUTH");
        assert!(Error::Timeout(250).to_string().contains("250 ms"));
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
