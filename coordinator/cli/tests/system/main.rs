//! The built `longhaul` binary with real processes: rehearsals, and the
//! agent and coordinator together (`longhaul internal agent|replica`, as a
//! rehearsal starts them). They live beside the binary because cargo hands
//! `CARGO_BIN_EXE_longhaul` only to the package's own tests.

#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod agent_tls;
mod agents;
mod rehearse;
mod remote;
