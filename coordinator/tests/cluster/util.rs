//! Shared helpers: the test kit (`longhaul_testkit`).

pub use longhaul_testkit::*;
