//! The pure core of longhaul.
//!
//! Everything here is a function of its inputs: no I/O, no clock reads, no
//! global random number generator, no async runtime. Files are parsed from
//! strings the caller has read; time and randomness, where later modules need
//! them, come in as arguments. This is what lets the agent, the simulator and
//! the coordinator share one model, and what lets tests run without a runtime.

pub mod config;
pub mod cost;
pub mod gpu;
pub mod identity;
pub mod job;
pub mod lease;
pub mod limits;
pub mod linearizability;
pub mod placement;
pub mod rng;
pub mod scenario;
pub mod state;
pub mod sync;
pub mod telemetry;
pub mod topology;
pub mod units;

pub use config::{ConfigError, Issue};
pub use job::JobSpec;
pub use scenario::Scenario;
pub use topology::Topology;
