//! longhaul's coordinator crate: the operator CLI (`longhaul`) and the
//! Raft-replicated control plane (consensus, storage, and soon the gRPC
//! services).

pub mod consensus;
pub mod daemon;
pub mod metrics;
pub mod process;
pub mod server;
