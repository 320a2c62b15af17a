//! The process's monotonic clock. A wall-clock jump changes no window, and
//! every thread of the process (worker threads included) reads the same base.

use std::sync::OnceLock;
use std::time::Instant;

static BASE: OnceLock<Instant> = OnceLock::new();

/// Microseconds since the first call in this process.
pub fn now_us() -> u64 {
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX)
}
