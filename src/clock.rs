//! The process's clock: microseconds since the Unix epoch, read from the wall
//! clock once per process and advanced from then on by the monotonic clock.
//! Windows align on the epoch as Redis's (its server's `TIME`) and seed 004's
//! (`Date.now()`) do, yet a wall-clock jump changes no window, and every
//! thread of the process (worker threads included) reads the same clock.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock's epoch µs less the monotonic clock's, taken once.
static OFFSET: OnceLock<u64> = OnceLock::new();

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// How far the monotonic clock is behind the epoch; the first call fixes it.
fn offset() -> u64 {
    *OFFSET.get_or_init(|| wall_us().saturating_sub(monotonic_us()))
}

/// Microseconds since the epoch, on a clock that never goes back. Read on
/// every hit: one vDSO call and one add.
#[inline]
pub fn now_us() -> u64 {
    offset() + monotonic_us()
}

/// Microseconds on the system's monotonic clock: on Unix one vDSO call,
/// without `Instant`'s checked arithmetic.
#[cfg(unix)]
fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec and CLOCK_MONOTONIC exists on every Unix we build for.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// Microseconds since the first call in this process.
#[cfg(not(unix))]
fn monotonic_us() -> u64 {
    use std::time::Instant;
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_goes_back() {
        let mut last = super::now_us();
        for _ in 0..10_000 {
            let now = super::now_us();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn reads_the_wall_clock_within_a_little() {
        let now = super::now_us();
        let wall = super::wall_us();
        assert!(now.abs_diff(wall) < 50_000, "{now} vs {wall}");
    }
}
