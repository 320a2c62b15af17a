//! How a connection's health is judged, as pure pieces every store's
//! connections drive (Redis, PostgreSQL, MySQL; they do no I/O and read no
//! clock: the caller passes `now`): [`Backoff`] spaces out connects after
//! failures, and [`Stall`] says when a connection that stopped answering
//! must be replaced. Which Redis answers demote a server is
//! `redis::reply::Code::demotion`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::errors::Error;

/// The wait after the first failed connect in a row; it doubles with each
/// further failure, up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// Hits in a row that timed out, after which a connection that does answer
/// other hits meanwhile counts as stuck.
pub const TIMEOUTS_BEFORE_REPLACING: u32 = 3;

/// What a caller that needs a connection may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// No failure lately: connect (callers may share one connect).
    Open,
    /// The wait is over: this caller alone tries to connect, until
    /// [`Backoff::failed`] or [`Backoff::succeeded`].
    Probe,
    /// Backing off: reject the hit at once, unsent, with this error.
    Refuse(Error),
}

/// Connects after failures: after the nth failure in a row no connect is
/// tried for a delay drawn evenly from [d/2, d], d = 100 ms × 2^(n−1) up to
/// 5 s (the jitter keeps many processes from reconnecting in step); then one
/// probe at a time. A connection that answers resets it.
#[derive(Debug)]
pub struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
    probing: bool,
    last: Option<Error>,
    rng: u64,
}

impl Backoff {
    /// `seed` draws the jitter; any value will do (0 is replaced).
    pub fn new(seed: u64) -> Backoff {
        Backoff {
            failures: 0,
            retry_at: None,
            probing: false,
            last: None,
            rng: seed.max(1),
        }
    }

    /// Whether a connect may be tried at `now`.
    pub fn gate(&mut self, now: Instant) -> Gate {
        let Some(retry_at) = self.retry_at else {
            return Gate::Open;
        };
        if !self.probing && now >= retry_at {
            self.probing = true;
            return Gate::Probe;
        }
        let cause = self
            .last
            .clone()
            .unwrap_or(Error::Internal("backing off with no failure recorded"));
        Gate::Refuse(Error::BackingOff {
            cause: Box::new(cause),
            failures: self.failures,
            retry_ms: retry_at.saturating_duration_since(now).as_millis() as u64,
        })
    }

    /// A connect failed with `error`, or a connection proved unusable before
    /// it answered: no connect until the returned delay has passed.
    pub fn failed(&mut self, now: Instant, error: Error) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = self.delay();
        self.retry_at = Some(now + delay);
        self.probing = false;
        self.last = Some(error);
        delay
    }

    /// A connection answered: connects are free again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_at = None;
        self.probing = false;
        self.last = None;
    }

    /// Failed connects in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    fn delay(&mut self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(16);
        let full = FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY);
        // xorshift64: plenty for jitter.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = full / 2;
        half + Duration::from_nanos(self.rng % (half.as_nanos() as u64 + 1))
    }
}

/// What a connection had answered when a hit was sent on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark(u64);

/// Timeouts on one connection, to tell a stuck one from a slow hit. After
/// a timeout a connection that answered nothing since that hit was sent is
/// stuck (a half-open socket: at low traffic this costs one failed hit, not
/// three); one that answered other hits meanwhile is stuck only after
/// [`TIMEOUTS_BEFORE_REPLACING`] timeouts in a row. Atomic, so the hot path
/// takes no lock.
#[derive(Debug, Default)]
pub struct Stall {
    answers: AtomicU64,
    timeouts: AtomicU32,
}

impl Stall {
    /// Taken just before hits are sent.
    pub fn mark(&self) -> Mark {
        Mark(self.answers.load(Ordering::Relaxed))
    }

    /// Hits were answered.
    pub fn answered(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// `hits` sent at `sent` timed out: true if the connection must be replaced.
    pub fn timed_out(&self, sent: Mark, hits: usize) -> bool {
        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
        let in_row = self
            .timeouts
            .fetch_add(hits, Ordering::Relaxed)
            .saturating_add(hits);
        self.mark() == sent || in_row >= TIMEOUTS_BEFORE_REPLACING
    }

    /// A new connection: no timeouts yet.
    pub fn reset(&self) {
        self.timeouts.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(gate: Gate) -> Error {
        match gate {
            Gate::Refuse(e) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let start = Instant::now();
        for seed in [0, 1, 42, u64::MAX] {
            let mut backoff = Backoff::new(seed);
            let mut full = FIRST_DELAY;
            for _ in 0..12 {
                let delay = backoff.failed(start, Error::Closed);
                assert!(delay >= full / 2 && delay <= full, "{delay:?} for {full:?}");
                full = (full * 2).min(MAX_DELAY);
            }
            assert_eq!(backoff.failures(), 12);
        }
        let delays: Vec<_> = (0..8)
            .map(|_| Backoff::new(7).failed(start, Error::Closed))
            .collect();
        assert!(delays.windows(2).all(|w| w[0] == w[1]), "a seed repeats");
        let mut backoff = Backoff::new(7);
        let spread: std::collections::HashSet<_> = (0..8)
            .map(|_| {
                backoff.succeeded();
                backoff.failed(start, Error::Closed)
            })
            .collect();
        assert!(spread.len() > 1, "the jitter varies");
    }

    #[test]
    fn one_probe_after_the_wait_and_refusals_meanwhile() {
        let start = Instant::now();
        let mut backoff = Backoff::new(3);
        assert_eq!(backoff.gate(start), Gate::Open);
        assert_eq!(backoff.gate(start), Gate::Open, "open gates are shared");
        let cause = Error::Connection {
            text: "could not connect to Redis: refused".into(),
            sent: false,
        };
        let delay = backoff.failed(start, cause.clone());
        let e = refused(backoff.gate(start));
        assert_eq!((e.code(), e.sent()), ("ERR_CONNECTION", Some(false)));
        assert_eq!(
            e,
            Error::BackingOff {
                cause: Box::new(cause.clone()),
                failures: 1,
                retry_ms: delay.as_millis() as u64
            }
        );
        let later = start + delay;
        assert_eq!(backoff.gate(later), Gate::Probe);
        let e = refused(backoff.gate(later));
        assert!(e.to_string().contains("while a connect is tried"), "{e}");
        let delay = backoff.failed(later, Error::Timeout { ms: 5, sent: false });
        assert_eq!(refused(backoff.gate(later)).code(), "ERR_TIMEOUT");
        assert_eq!(backoff.gate(later + delay), Gate::Probe);
        backoff.succeeded();
        assert_eq!(backoff.gate(later), Gate::Open);
        assert_eq!(backoff.failures(), 0);
        // The count starts again from the first delay.
        assert!(backoff.failed(later, cause) <= FIRST_DELAY);
    }

    #[test]
    fn a_silent_connection_is_stuck_after_one_timeout() {
        let stall = Stall::default();
        stall.answered();
        let sent = stall.mark();
        assert!(
            stall.timed_out(sent, 1),
            "nothing answered since it was sent"
        );
    }

    #[test]
    fn an_answering_connection_is_stuck_after_three_timeouts_in_a_row() {
        let stall = Stall::default();
        let sent = stall.mark();
        stall.answered(); // another hit, sent later, was answered
        assert!(!stall.timed_out(sent, 1));
        assert!(!stall.timed_out(sent, 1));
        stall.answered(); // a timeout run is broken by an answer
        assert!(!stall.timed_out(sent, 2));
        assert!(stall.timed_out(sent, 1));
        stall.reset();
        assert!(!stall.timed_out(sent, 2));
        assert!(stall.timed_out(sent, 1));
    }
}
