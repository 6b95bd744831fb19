//! Shared helpers (they live in the library, for the agent's tests too).

pub use longhaul_coordinator::testing::*;
