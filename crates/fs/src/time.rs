//! The clock of file times.

use crate::keys::Time;

/// The coarse clock of timestamps: wall time truncated to milliseconds
/// (Linux's own file times come from a clock of 1-10 ms granularity).
pub fn now() -> Time {
    let t = Time::from_system(std::time::SystemTime::now());
    Time { sec: t.sec, nsec: t.nsec / 1_000_000 * 1_000_000 }
}
