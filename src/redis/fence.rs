//! `waitForReplicas`: a connection's writes are followed by `WAIT replicas
//! ms`, and the calls written before it are answered only once that many
//! replicas confirm them, so that a failover that promotes one of them
//! keeps every count a call answered. The rules both transports share: one
//! `WAIT` out at a time on a connection (a `WAIT` blocks the connection on
//! the server, so a second one would only add its time to the first's),
//! its time cut so that it answers before the calls it covers time out, and
//! what its reply means for them.

use std::time::Instant;

use super::reply::{Code, Reply};
use crate::errors::Error;

/// How late a `WAIT` may answer after its time: an idle server checks
/// blocked clients' timeouts on its cron tick, every 100 ms at Redis's
/// default `hz 10`.
pub const SERVER_TICK_MS: u64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub replicas: u32,
    /// Half the store's timeoutMs: the longest a `WAIT` waits.
    pub timeout_ms: u64,
}

/// What the calls a `WAIT` covered get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enough replicas have them: their answers stand.
    Confirmed,
    /// They ran on the master but are not confirmed: each rejects with
    /// `error` (`sent: true`). `demoted`: the server is a replica now, and
    /// the connection should be replaced.
    Rejected { error: Error, demoted: bool },
}

impl Fence {
    /// How long a `WAIT` written at `now` may wait, for calls whose earliest
    /// deadline is `earliest`: `timeout_ms`, or less, so that it answers
    /// before that deadline, and never 0, which would wait for ever. Kept
    /// back from the time left: [`SERVER_TICK_MS`], and a fifth of the rest
    /// for the round trip.
    pub fn wait_ms(&self, now: Instant, earliest: Option<Instant>) -> u64 {
        let left = earliest.map_or(u64::MAX, |at| {
            let left = at.saturating_duration_since(now).as_millis() as u64;
            left.saturating_sub(SERVER_TICK_MS)
        });
        self.timeout_ms.min(left - left / 5).max(1)
    }

    /// What `reply`, a `WAIT ... ms`'s, means for the calls before it.
    pub fn verdict(&self, reply: Reply<'_>, ms: u64) -> Verdict {
        let unconfirmed = |acked: i64| Verdict::Rejected {
            error: Error::Unconfirmed {
                acked,
                wanted: self.replicas,
                ms,
            },
            demoted: false,
        };
        match reply {
            Reply::Int(n) if n >= i64::from(self.replicas) => Verdict::Confirmed,
            Reply::Int(n) => unconfirmed(n.max(0)),
            Reply::Error(code, detail) => {
                let text = match detail {
                    Some(detail) => format!("{code} {detail}"),
                    None => code.to_string(),
                };
                let code = Code::of(code);
                let demoted =
                    code.demotion() || detail.is_some_and(|d| d.contains("used with replica"));
                Verdict::Rejected {
                    error: Error::WaitRefused {
                        text,
                        noperm: code == Code::NoPerm,
                    },
                    demoted,
                }
            }
            Reply::Array(_) | Reply::Other => unconfirmed(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const ONE: Fence = Fence {
        replicas: 1,
        timeout_ms: 500,
    };

    #[test]
    fn a_wait_answers_before_the_earliest_deadline_it_covers() {
        let now = Instant::now();
        assert_eq!(ONE.wait_ms(now, None), 500);
        assert_eq!(ONE.wait_ms(now, Some(now + Duration::from_secs(5))), 500);
        // 400 ms left: 100 for the server's tick, a fifth of the other 300 for the round trip.
        assert_eq!(
            ONE.wait_ms(now, Some(now + Duration::from_millis(400))),
            240
        );
        // Never 0 (WAIT's "for ever"), even for a deadline already passed.
        assert_eq!(ONE.wait_ms(now, Some(now)), 1);
        assert_eq!(ONE.wait_ms(now + Duration::from_secs(1), Some(now)), 1);
    }

    #[test]
    fn a_wait_confirms_with_enough_replicas_and_rejects_sent_otherwise() {
        assert_eq!(ONE.verdict(Reply::Int(1), 500), Verdict::Confirmed);
        assert_eq!(ONE.verdict(Reply::Int(2), 500), Verdict::Confirmed);
        let Verdict::Rejected { error, demoted } = ONE.verdict(Reply::Int(0), 320) else {
            panic!("0 replicas confirmed")
        };
        assert_eq!(
            (error.to_string().contains("only 0 of the 1"), demoted),
            (true, false)
        );
        assert!(error.to_string().contains("within 320 ms"));
        assert_eq!((error.code(), error.sent()), ("ERR_REDIS", Some(true)));
        // A demoted master refuses WAIT: its connection is replaced.
        let replica = Some("WAIT cannot be used with replica instances. Please also note …");
        let Verdict::Rejected { error, demoted } = ONE.verdict(Reply::Error("ERR", replica), 1)
        else {
            panic!("refused")
        };
        assert!(demoted);
        assert_eq!((error.code(), error.sent()), ("ERR_REDIS", Some(true)));
        // An ACL user without WAIT: the message says what to grant.
        let noperm = Some("User app has no permissions to run the 'wait' command");
        let Verdict::Rejected { error, demoted } = ONE.verdict(Reply::Error("NOPERM", noperm), 1)
        else {
            panic!("refused")
        };
        assert!(!demoted);
        assert_eq!((error.code(), error.sent()), ("ERR_REDIS", Some(true)));
        assert!(error.to_string().contains("+wait"), "{error}");
    }
}
