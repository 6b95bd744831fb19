//! The built `longhaul` binary with real processes: rehearsals, and the
//! agent and coordinator together (`longhaul internal agent|replica`, as a
//! rehearsal starts them). They live beside the binary because cargo hands
//! `CARGO_BIN_EXE_longhaul` only to the package's own tests.

#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

/// One test of this binary at a time: each starts a cluster of processes
/// (the rehearsal five, the agents test six) that time their elections and
/// leases; two of them at once on a 2-core machine starve each other's
/// timers into spurious elections. (A test that panics while holding it
/// does not stop the others: the lock does not poison.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod agent_tls;
mod agents;
mod certs;
mod metrics;
mod rehearse;
mod remote;
mod training;
