//! The helpers of the file system's test suites: seeds and noise from
//! zlogfs-testkit, the engine's small options from its `testing` module.
#![allow(unused_imports, reason = "each test program uses a part of the helpers")]

pub use zlogfs_engine::testing::small_opts;
pub use zlogfs_testkit::{noise, rng, seed};
