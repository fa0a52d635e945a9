//! Test helpers shared by every crate of zlogfs, each written once.
//!
//! - Seeds: a randomised test takes its seed from [`seed`], which reads
//!   `ZLOGFS_SEED` or draws one, and prints it so the run can be replayed
//!   with `ZLOGFS_SEED=N`. [`replaying`] says whether a seed was given
//!   (tests then run one round instead of many).
//! - [`noise`]: incompressible bytes from a seed.
//! - [`proc`]: fresh directories, programs run to success, waiting for a
//!   condition.
//! - `s3` (the `s3` feature): a real S3 server (moto) for the tests.

pub mod proc;
#[cfg(feature = "s3")]
pub mod s3;

use rand::rngs::StdRng;
use rand::SeedableRng;

/// The environment variable that replays a randomised test.
pub const SEED_VAR: &str = "ZLOGFS_SEED";

/// The seed for the randomised test `test`: `ZLOGFS_SEED` if set, else a
/// random one; printed so that a failure can be replayed.
///
/// # Panics
/// When `ZLOGFS_SEED` is set but is not a number (a replay with a typo
/// must not quietly run another seed).
pub fn seed(test: &str) -> u64 {
    let s = match std::env::var(SEED_VAR) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{SEED_VAR}={v:?} is not a number")),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: seed {s} (replay with {SEED_VAR}={s})");
    s
}

/// Whether `ZLOGFS_SEED` names the seed (a replay: run one round).
pub fn replaying() -> bool {
    std::env::var_os(SEED_VAR).is_some()
}

/// A random-number generator from `seed`.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Incompressible bytes: `n` of a xorshift stream from `seed` (0 is taken
/// as 1).
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_deterministic_and_not_constant() {
        assert_eq!(noise(7, 64), noise(7, 64));
        assert_ne!(noise(7, 64), noise(8, 64));
        let n = noise(7, 4096);
        assert!(n.iter().any(|&b| b != n[0]));
    }
}
