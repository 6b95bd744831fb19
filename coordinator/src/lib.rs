//! The Raft-replicated coordinator service.

pub mod consensus;
