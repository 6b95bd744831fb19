//! longhaul's coordinator crate: the operator CLI (`longhaul`) and, as it
//! grows, the Raft-replicated control plane.

pub mod cli;
