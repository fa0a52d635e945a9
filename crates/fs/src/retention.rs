//! Which automatic points of history are kept (issue 28; the design is
//! docs/decisions/2026-11-25-history-design.md): the retention policy and
//! its thinning, pure code.
//!
//! A policy keeps every point younger than `all`, then the last point of
//! each hour younger than `hourly`, then the last point of each day
//! younger than `daily`. Hours and days are aligned to UTC, so the last
//! point of a day is also the last of its last hour: a point dropped by
//! thinning at one time is never wanted again later, and thinning can run
//! at every commit without ever needing a point back.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

/// The retention policy of automatic points, in seconds of age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Every point younger than this is kept.
    pub all: i64,
    /// Then the last point of each hour younger than this.
    pub hourly: i64,
    /// Then the last point of each day younger than this.
    pub daily: i64,
}

impl Policy {
    /// No automatic points (named snapshots only).
    pub const NONE: Policy = Policy { all: 0, hourly: 0, daily: 0 };

    /// The default: every commit for an hour, hourly for two days, daily
    /// for 31 days.
    pub const DEFAULT: Policy = Policy { all: HOUR, hourly: 2 * DAY, daily: 31 * DAY };

    /// Whether automatic points are kept at all.
    pub fn keeps_any(&self) -> bool {
        self.all > 0 || self.hourly > 0 || self.daily > 0
    }

    /// Which of `times` (seconds since 1970 of the points, ascending) this
    /// policy keeps at `now`.
    pub fn keep(&self, times: &[i64], now: i64) -> Vec<bool> {
        let mut keep = vec![false; times.len()];
        for (i, &t) in times.iter().enumerate() {
            let age = now - t;
            // The last point of its hour (day): the next point, if any,
            // lies in a later one.
            let last_in =
                |unit: i64| times.get(i + 1).is_none_or(|&n| n.div_euclid(unit) != t.div_euclid(unit));
            keep[i] = age < self.all
                || (age < self.hourly && last_in(HOUR))
                || (age < self.daily && last_in(DAY))
                // The newest point stands for the present.
                || i + 1 == times.len() && self.keeps_any();
        }
        keep
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::DEFAULT
    }
}

/// "none", or "all:1h,hourly:2d,daily:31d" (any of the three, in any
/// order, with s, m, h, d or w units; a missing one is 0).
impl FromStr for Policy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Policy> {
        let s = s.trim();
        if s == "none" {
            return Ok(Policy::NONE);
        }
        let bad = |why: String| {
            Error::Invalid(format!(
                "history policy {s:?}: {why} (e.g. \"all:1h,hourly:2d,daily:31d\" or \"none\")"
            ))
        };
        let mut p = Policy::NONE;
        for part in s.split(',').map(str::trim) {
            let (name, age) = part.split_once(':').ok_or_else(|| bad(format!("{part:?} has no ':'")))?;
            let secs =
                parse_age(age).ok_or_else(|| bad(format!("{age:?} is not an age like 90m, 1h, 2d")))?;
            match name {
                "all" => p.all = secs,
                "hourly" => p.hourly = secs,
                "daily" => p.daily = secs,
                n => return Err(bad(format!("unknown part {n:?}"))),
            }
        }
        Ok(p)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.keeps_any() {
            return write!(f, "none");
        }
        write!(f, "all:{},hourly:{},daily:{}", age(self.all), age(self.hourly), age(self.daily))
    }
}

fn parse_age(s: &str) -> Option<i64> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let mul = match unit {
        "s" => 1,
        "m" => 60,
        "h" => HOUR,
        "d" => DAY,
        "w" => 7 * DAY,
        _ => return None,
    };
    n.parse::<i64>().ok()?.checked_mul(mul).filter(|&v| v >= 0)
}

/// An age in the largest unit that divides it.
fn age(secs: i64) -> String {
    for (unit, name) in [(7 * DAY, "w"), (DAY, "d"), (HOUR, "h"), (60, "m")] {
        if secs > 0 && secs % unit == 0 {
            return format!("{}{name}", secs / unit);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn policies_parse_and_print() {
        assert_eq!("none".parse::<Policy>().unwrap(), Policy::NONE);
        assert_eq!("all:1h,hourly:2d,daily:31d".parse::<Policy>().unwrap(), Policy::DEFAULT);
        assert_eq!(Policy::DEFAULT.to_string(), "all:1h,hourly:2d,daily:31d");
        assert_eq!("daily:2w".parse::<Policy>().unwrap(), Policy { all: 0, hourly: 0, daily: 14 * DAY });
        for p in [Policy::DEFAULT, Policy::NONE, Policy { all: 90 * 60, hourly: 7, daily: 0 }] {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p, "{p}");
        }
        for bad in ["", "all", "all:1y", "weekly:1d", "all:-1h", "all:h"] {
            assert!(bad.parse::<Policy>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_keeps_every_recent_point_then_one_an_hour_then_one_a_day() {
        let now = 100 * DAY;
        // A point every 10 minutes for 40 days.
        let times: Vec<i64> = (0..40 * 144).map(|i| now - 40 * DAY + i * 600).collect();
        let keep = Policy::DEFAULT.keep(&times, now);
        let kept: Vec<i64> = times.iter().zip(&keep).filter(|(_, k)| **k).map(|(t, _)| *t).collect();
        let recent = kept.iter().filter(|&&t| now - t < HOUR).count();
        assert_eq!(recent, 5, "every point of the last hour (ages 10 to 50 minutes)");
        let hours = kept.iter().filter(|&&t| (HOUR..2 * DAY).contains(&(now - t))).count();
        assert!((47..=49).contains(&hours), "one an hour for two days: {hours}");
        assert!(kept.iter().all(|&t| now - t < 31 * DAY), "nothing past 31 days");
        assert!(kept.len() < 6 + 49 + 31, "{}", kept.len());
        assert_eq!(Policy::NONE.keep(&times, now), vec![false; times.len()]);
    }

    /// Thinning never wants back a point it dropped, and thinning only the
    /// points kept so far (all the file system has records of) gives what
    /// thinning every point ever taken would.
    #[test]
    fn a_dropped_point_is_never_wanted_again() {
        let seed = zlogfs_testkit::seed("dropped points");
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let kept_of = |times: &[i64], keep: &[bool]| -> Vec<i64> {
            times.iter().zip(keep).filter(|(_, k)| **k).map(|(t, _)| *t).collect()
        };
        for _ in 0..200 {
            let p = Policy {
                all: r.gen_range(0..3 * HOUR),
                hourly: r.gen_range(0..3 * DAY),
                daily: r.gen_range(0..40 * DAY),
            };
            let mut now = 50 * DAY;
            let mut ever: Vec<i64> = Vec::new();
            let mut kept: Vec<i64> = Vec::new();
            let mut dropped: std::collections::HashSet<i64> = std::collections::HashSet::new();
            for _ in 0..300 {
                // Bursts of commits, quiet hours and quiet days.
                now += match r.gen_range(0..3) {
                    0 => r.gen_range(1..600),
                    1 => r.gen_range(1..4 * HOUR),
                    _ => r.gen_range(1..3 * DAY),
                };
                let t = now - r.gen_range(0..60);
                if ever.last().is_some_and(|&l| l >= t) {
                    continue;
                }
                ever.push(t);
                kept.push(t);
                let from_ever = kept_of(&ever, &p.keep(&ever, now));
                let from_kept = kept_of(&kept, &p.keep(&kept, now));
                assert_eq!(from_kept, from_ever, "policy {p}, now {now}");
                assert!(
                    !from_ever.iter().any(|t| dropped.contains(t)),
                    "policy {p}, now {now}: a point came back"
                );
                dropped.extend(kept.iter().filter(|t| !from_kept.contains(t)));
                kept = from_kept;
            }
        }
    }
}
