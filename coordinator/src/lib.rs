//! longhaul's coordinator crate: the operator CLI (`longhaul`) and the
//! Raft-replicated control plane (consensus, storage, and soon the gRPC
//! services).

pub mod cli;
pub mod consensus;
pub mod daemon;
pub mod server;
pub mod testing;
