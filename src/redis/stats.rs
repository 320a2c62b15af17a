//! What a Redis store counts for `stats()`, the same for both transports,
//! and the connection events it reports to `onError`.

use std::time::Duration;

use crate::histogram::Histogram;

/// A store's counts. Each transport keeps one where its I/O runs: plain
/// integers on the event loop; under a lock taken once per pipeline on the
/// I/O thread of a cluster.
#[derive(Clone, Default)]
pub struct Tally {
    /// Connections opened.
    pub connects: u64,
    /// Connections opened after one was lost.
    pub reconnects: u64,
    /// Connects that failed.
    pub connect_failures: u64,
    /// Open connections that failed (dropped, stalled, demoted server).
    pub losses: u64,
    /// Calls that timed out, sent or not.
    pub timeouts: u64,
    /// Scripts sent again whole (EVAL) after NOSCRIPT.
    pub noscript: u64,
    /// MOVED and ASK answers followed (cluster).
    pub redirections: u64,
    /// How long answered calls took, from send to answer.
    pub latency: Histogram,
}

/// Numbers `Tally::numbers` gives, in order.
pub const NUMBERS: usize = 13;

impl Tally {
    pub fn answered(&mut self, took: Duration) {
        self.latency.record(took.as_micros() as u64);
    }

    /// `[connects, reconnects, connectFailures, losses, timeouts,
    /// noscriptReloads, redirections, answered, sum, p50, p90, p99, max]`, the
    /// latencies in µs: what JavaScript's `stats()` is made from.
    pub fn numbers(&self) -> [f64; NUMBERS] {
        let h = &self.latency;
        [
            self.connects,
            self.reconnects,
            self.connect_failures,
            self.losses,
            self.timeouts,
            self.noscript,
            self.redirections,
            h.count(),
            h.sum(),
            h.quantile(0.5),
            h.quantile(0.9),
            h.quantile(0.99),
            h.max(),
        ]
        .map(|n| n as f64)
    }
}

/// A change of a connection's state, as `onError` receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The first connection is open.
    Connected,
    /// An open connection failed, with the code its calls rejected with.
    Lost(&'static str),
    /// A connection is open again after a loss.
    Reconnected,
}

impl Event {
    pub fn kind(self) -> &'static str {
        match self {
            Event::Connected => "connected",
            Event::Lost(_) => "lost",
            Event::Reconnected => "reconnected",
        }
    }
}
