//! Shared helpers of the integration tests live in `tests.rs`'s modules; this
//! library target exists only so the package has one.
