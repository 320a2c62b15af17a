//! What a reply means, on every transport: the one mapping from a server's
//! reply (read from RESP by the connection engine, on either host, or from
//! JSON over REST) to an op's answer, and of a server's error, by its code,
//! to ratestore's error. Each transport only turns its own reply type into
//! a [`Reply`].

use crate::errors::{Error, Result};
use crate::ops::{Answer, Op};

/// Where a Redis client error happened: a failed connect sent no hit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Sent,
}

/// A reply as every transport reads it.
pub enum Reply<'a> {
    /// An array: its integers, or `None` if any item is not one.
    Array(Option<Vec<i64>>),
    Int(i64),
    /// A server error: its code and the text after it, if any.
    Error(&'a str, Option<&'a str>),
    /// Anything else (a status, a string, nil).
    Other,
}

/// The op's answer to `reply`, or the error the server answered.
pub fn outcome(op: Op, reply: Reply<'_>) -> Result<Answer> {
    match reply {
        Reply::Array(Some(values)) => op.answer(&values),
        Reply::Int(n) if op == Op::Unlink => op.answer(&[n]),
        Reply::Error(code, detail) => Err(server_error(code, detail, Stage::Sent)),
        _ if op == Op::Ping => op.answer(&[1]),
        _ => op.answer(&[]),
    }
}

/// An op's answers: its own, and for a step ([`Op::Takes`]) each take's
/// after the first (for any other op, none).
pub type Answers = (Answer, Vec<Answer>);

/// The answers of the op of `query` to `reply`: for a step, each take's,
/// in order (see [`super::step::answers`]).
pub fn outcomes(op: Op, key: &[u8], reply: Reply<'_>) -> Result<Answers> {
    if op != Op::Takes {
        return outcome(op, reply).map(|answer| (answer, Vec::new()));
    }
    match reply {
        Reply::Array(Some(values)) => {
            let mut all = super::step::answers(key, &values)?.into_iter();
            let first = all.next().ok_or(Error::Internal("a step of no takes"))?;
            Ok((first, all.collect()))
        }
        Reply::Error(code, detail) => Err(server_error(code, detail, Stage::Sent)),
        _ => Err(Error::Redis(
            "a script gave an answer of the wrong shape".into(),
        )),
    }
}

/// A server error's code (its first word), read once: each transport and
/// rule asks this, never the code's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// `NOSCRIPT`: an EVALSHA named a script the server does not hold.
    NoScript,
    /// `MOVED`: a cluster node serves the key's slot no longer.
    Moved,
    /// `ASK`: the key's slot is moving; this call goes to the node named.
    Ask,
    /// `READONLY`: the server was demoted to a replica.
    ReadOnly,
    /// `MASTERDOWN`: a replica lost its master.
    MasterDown,
    /// `LOADING`: the server is loading its data.
    Loading,
    /// `CLUSTERDOWN`: the cluster can't serve the slot now.
    ClusterDown,
    /// `TRYAGAIN`: a multi-key call during a slot's move.
    TryAgain,
    /// `COUNTRANGE`: ratestore's scripts refuse a count past 2^53.
    CountRange,
    /// `NOAUTH`, `WRONGPASS`: no or wrong credentials.
    Auth,
    /// `NOPERM`: the user may not run the command.
    NoPerm,
    /// Any other (`ERR`, `OOM`, `BUSY`, ...).
    Other,
}

impl Code {
    pub fn of(code: &str) -> Code {
        match code {
            "NOSCRIPT" => Code::NoScript,
            "MOVED" => Code::Moved,
            "ASK" => Code::Ask,
            "READONLY" => Code::ReadOnly,
            "MASTERDOWN" => Code::MasterDown,
            "LOADING" => Code::Loading,
            "CLUSTERDOWN" => Code::ClusterDown,
            "TRYAGAIN" => Code::TryAgain,
            "COUNTRANGE" => Code::CountRange,
            "NOAUTH" | "WRONGPASS" => Code::Auth,
            "NOPERM" => Code::NoPerm,
            _ => Code::Other,
        }
    }

    /// Answers after which the connection is dropped: the server was
    /// demoted to a replica, lost its master or is loading its data. A
    /// managed primary that fails over moves its DNS name, so the next
    /// connect, which resolves the name again, finds the new one.
    pub fn demotion(self) -> bool {
        matches!(self, Code::ReadOnly | Code::MasterDown | Code::Loading)
    }

    /// Answers that, in a cluster, say the node is in trouble (a demotion,
    /// or the cluster can't serve the slot now): the slot map is asked for
    /// again.
    pub fn node_trouble(self) -> bool {
        self.demotion() || matches!(self, Code::ClusterDown | Code::TryAgain)
    }
}

/// An error answered by the server, by its code.
pub fn server_error(code: &str, detail: Option<&str>, stage: Stage) -> Error {
    let text = || match detail {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_string(),
    };
    match Code::of(code) {
        Code::CountRange => Error::CountOutOfRange,
        Code::Auth | Code::NoPerm => Error::Auth(text()),
        // AUTH with a password to a server that has none answers a plain ERR.
        Code::Other
            if code == "ERR"
                && stage == Stage::Connect
                && detail.is_some_and(|d| d.contains("AUTH")) =>
        {
            Error::Auth(text())
        }
        _ => Error::Redis(text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demotions_and_node_trouble_by_code() {
        // (code, a demotion: the connection is dropped; node trouble: the slot map is asked again)
        for (code, demotion, trouble) in [
            ("READONLY", true, true),
            ("MASTERDOWN", true, true),
            ("LOADING", true, true),
            ("CLUSTERDOWN", false, true),
            ("TRYAGAIN", false, true),
            ("ERR", false, false),
            ("NOSCRIPT", false, false),
            ("MOVED", false, false),
            ("ASK", false, false),
            ("COUNTRANGE", false, false),
            ("NOPERM", false, false),
            ("OOM", false, false),
        ] {
            assert_eq!(Code::of(code).demotion(), demotion, "{code}");
            assert_eq!(Code::of(code).node_trouble(), trouble, "{code}");
        }
    }

    #[test]
    fn reads_each_code_once() {
        let codes = [
            ("NOSCRIPT", Code::NoScript),
            ("MOVED", Code::Moved),
            ("ASK", Code::Ask),
            ("READONLY", Code::ReadOnly),
            ("MASTERDOWN", Code::MasterDown),
            ("LOADING", Code::Loading),
            ("CLUSTERDOWN", Code::ClusterDown),
            ("TRYAGAIN", Code::TryAgain),
            ("COUNTRANGE", Code::CountRange),
            ("NOAUTH", Code::Auth),
            ("WRONGPASS", Code::Auth),
            ("NOPERM", Code::NoPerm),
            ("ERR", Code::Other),
            ("BUSY", Code::Other),
            // Codes are case-sensitive, as the server writes them.
            ("noscript", Code::Other),
            ("", Code::Other),
        ];
        for (text, code) in codes {
            assert_eq!(Code::of(text), code, "{text}");
        }
    }

    #[test]
    fn server_errors_by_code() {
        assert_eq!(
            server_error("COUNTRANGE", Some("x"), Stage::Sent),
            Error::CountOutOfRange
        );
        assert_eq!(
            server_error("WRONGPASS", Some("invalid pair"), Stage::Connect).code(),
            "ERR_AUTH"
        );
        assert_eq!(server_error("NOAUTH", None, Stage::Sent).code(), "ERR_AUTH");
        let no_password = Some("AUTH <password> called without any password configured");
        assert_eq!(
            server_error("ERR", no_password, Stage::Connect).code(),
            "ERR_AUTH"
        );
        assert_eq!(
            server_error("ERR", no_password, Stage::Sent).code(),
            "ERR_REDIS"
        );
        let oom = server_error("OOM", Some("command not allowed"), Stage::Sent);
        assert_eq!(oom, Error::Redis("OOM command not allowed".into()));
    }

    #[test]
    fn replies_to_answers() {
        assert_eq!(
            outcome(Op::Hit, Reply::Array(Some(vec![3, 10]))),
            Ok(Answer::new(&[3, 10]))
        );
        assert_eq!(
            outcome(Op::Hit, Reply::Array(None)).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(outcome(Op::Unlink, Reply::Int(2)), Ok(Answer::new(&[2])));
        assert_eq!(outcome(Op::Ping, Reply::Other), Ok(Answer::new(&[1])));
        assert_eq!(
            outcome(Op::Hit, Reply::Error("COUNTRANGE", None)),
            Err(Error::CountOutOfRange)
        );
        assert_eq!(
            outcome(Op::Hit, Reply::Other).unwrap_err().code(),
            "ERR_REDIS"
        );
    }
}
