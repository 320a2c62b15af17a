//! The one error type of the core. Messages never contain a key, a URL or a
//! credential: they are built only from constant text and numbers.

/// Which JavaScript class an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsClass {
    Error,
    TypeError,
    RangeError,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
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
            Error::Internal(_) => "ERR_INTERNAL",
        }
    }

    pub fn js_class(&self) -> JsClass {
        match self {
            Error::InvalidType(_) => JsClass::TypeError,
            Error::InvalidRange(_) | Error::CountOutOfRange => JsClass::RangeError,
            Error::StoreFull(_) | Error::Internal(_) => JsClass::Error,
        }
    }
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
    }
}
