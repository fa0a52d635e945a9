//! Times, as the records hold them.

use zlogfs_engine::bytes::{Put, Reader};
use zlogfs_engine::error::Result;

use super::*;

/// A point in time, in seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Time {
    /// Seconds (negative before 1970).
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Time {
    /// From a SystemTime.
    pub fn from_system(t: std::time::SystemTime) -> Time {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    Time { sec: -s, nsec: 0 }
                } else {
                    Time { sec: -s - 1, nsec: 1_000_000_000 - n }
                }
            }
        }
    }
    /// To a SystemTime.
    pub fn to_system(self) -> std::time::SystemTime {
        let base = std::time::UNIX_EPOCH;
        if self.sec >= 0 {
            base + std::time::Duration::new(self.sec as u64, self.nsec)
        } else {
            base - std::time::Duration::from_secs(self.sec.unsigned_abs())
                + std::time::Duration::from_nanos(u64::from(self.nsec))
        }
    }
    pub(super) fn put_delta(self, base: i64, v: &mut Vec<u8>) {
        v.put_var(zigzag(self.sec.wrapping_sub(base)));
        v.put_var(u64::from(self.nsec));
    }
    pub(super) fn get_delta(base: i64, r: &mut Reader) -> Result<Time> {
        let sec = base.wrapping_add(unzigzag(r.var()?));
        let nsec = r.var_max(999_999_999, "nanoseconds")? as u32;
        Ok(Time { sec, nsec })
    }
}
