//! What a Redis store counts for `stats()`, the same for both transports,
//! and the connection events it reports to `onError`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::histogram::Histogram;

/// A store's counts. Each transport keeps one where its I/O runs: plain
/// integers on the event loop; in a [`Monitor`], under a lock taken once
/// per pipeline's answers, on the I/O thread (a cluster, or REST).
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
    /// Calls that ran on the master but that fewer replicas than
    /// `waitForReplicas` confirmed.
    pub unconfirmed: u64,
    /// How long answered calls took, from send to answer.
    pub latency: Histogram,
}

/// Numbers `Tally::numbers` gives, in order.
pub const NUMBERS: usize = 14;

impl Tally {
    pub fn answered(&mut self, took: Duration) {
        self.latency.record(took.as_micros() as u64);
    }

    /// Moves these counts into `to` (the monitor of the I/O thread's
    /// connections), leaving none here.
    pub fn move_into(&mut self, to: &mut Tally) {
        let counts = [
            (&mut self.connects, &mut to.connects),
            (&mut self.reconnects, &mut to.reconnects),
            (&mut self.connect_failures, &mut to.connect_failures),
            (&mut self.losses, &mut to.losses),
            (&mut self.timeouts, &mut to.timeouts),
            (&mut self.noscript, &mut to.noscript),
            (&mut self.redirections, &mut to.redirections),
            (&mut self.unconfirmed, &mut to.unconfirmed),
        ];
        for (from, to) in counts {
            *to += std::mem::take(from);
        }
        if self.latency.count() > 0 {
            to.latency.merge(&self.latency);
            self.latency.clear();
        }
    }

    /// `[connects, reconnects, connectFailures, losses, timeouts,
    /// noscriptReloads, redirections, unconfirmed, answered, sum, p50, p90,
    /// p99, max]`, the
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
            self.unconfirmed,
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

pub use crate::delivery::{Event, Listener};

/// The counts and connection events of the connections a cluster's or a
/// REST store's nodes keep on the I/O thread, shared (as those connections
/// are) by the stores with the same settings.
#[derive(Default)]
pub struct Monitor {
    tally: Mutex<Tally>,
    listeners: Mutex<Vec<Weak<dyn Listener>>>,
    /// Some connection has been up: the first one only is `connected`.
    was_up: AtomicBool,
}

impl Monitor {
    pub fn tally(&self) -> MutexGuard<'_, Tally> {
        // Counts only: a poisoned lock still holds usable ones.
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `[connects, …]`, as `Tally::numbers`.
    pub fn numbers(&self) -> [f64; NUMBERS] {
        self.tally().numbers()
    }

    /// Tells `listener` of every event from now on, while it lives.
    pub fn listen(&self, listener: Weak<dyn Listener>) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        listeners.retain(|l| l.strong_count() > 0);
        listeners.push(listener);
    }

    /// Tells every listener of `event`.
    pub fn tell(&self, event: Event) {
        let listeners: Vec<_> = {
            let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
            listeners.retain(|l| l.strong_count() > 0);
            listeners.iter().filter_map(Weak::upgrade).collect()
        };
        for listener in listeners {
            listener.tell(event);
        }
    }

    /// A connection was opened (one more connect, no event by itself).
    pub fn opened(&self) {
        self.tally().connects += 1;
    }

    /// A connect failed, or was given up when its deadline passed.
    pub fn connect_failed(&self) {
        self.tally().connect_failures += 1;
    }

    /// The nodes can be reached through a connection just opened (`opened`
    /// counted it): `connected` the first time; after a loss not yet made
    /// good (only `lost` and `up` change the two counts, so their difference
    /// is the losses not yet replaced), a reconnect (`reconnected`).
    pub fn up(&self) {
        let replaces = {
            let mut tally = self.tally();
            let replaces = tally.losses > tally.reconnects;
            tally.reconnects += u64::from(replaces);
            replaces
        };
        if replaces {
            self.tell(Event::Reconnected);
        } else if !self.was_up.swap(true, Ordering::Relaxed) {
            self.tell(Event::Connected);
        }
    }

    /// An open connection failed; `code` is what its calls rejected with.
    pub fn lost(&self, code: &'static str) {
        self.tally().losses += 1;
        self.tell(Event::Lost(code));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Heard(Mutex<Vec<Event>>);

    impl Listener for Heard {
        fn tell(&self, event: Event) {
            self.0.lock().unwrap().push(event);
        }
    }

    #[test]
    fn a_monitor_tells_connected_once_and_a_reconnect_per_loss() {
        let monitor = Monitor::default();
        let heard = Arc::new(Heard(Mutex::default()));
        let weak: Weak<Heard> = Arc::downgrade(&heard);
        monitor.listen(weak);
        for _ in 0..3 {
            monitor.opened();
            monitor.up(); // three nodes: one `connected`
        }
        monitor.lost("ERR_CONNECTION");
        monitor.lost("ERR_TIMEOUT");
        monitor.connect_failed();
        for _ in 0..3 {
            monitor.opened();
            monitor.up(); // two replace the lost ones, the third is a new node
        }
        let t = monitor.tally().clone();
        assert_eq!(
            (t.connects, t.reconnects, t.connect_failures, t.losses),
            (6, 2, 1, 2)
        );
        use Event::*;
        assert_eq!(
            *heard.0.lock().unwrap(),
            [
                Connected,
                Lost("ERR_CONNECTION"),
                Lost("ERR_TIMEOUT"),
                Reconnected,
                Reconnected
            ]
        );
        drop(heard);
        monitor.lost("ERR_CONNECTION"); // nobody listens: nothing to tell
        assert_eq!(monitor.listeners.lock().unwrap().len(), 0);
    }
}
