//! The process's monotonic clock. A wall-clock jump changes no window, and
//! every thread of the process (worker threads included) reads the same clock.

/// Microseconds on the system's monotonic clock. Read on every hit: on Unix
/// it is one vDSO call, without `Instant`'s checked arithmetic.
#[cfg(unix)]
pub fn now_us() -> u64 {
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
pub fn now_us() -> u64 {
    use std::sync::OnceLock;
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
}
