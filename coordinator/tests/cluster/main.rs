//! Coordinator clusters on loopback: in-process replicas over real gRPC, and
//! real `coordinator` processes. These live beside the binary (not in the
//! workspace's `tests/` crate) because cargo hands `CARGO_BIN_EXE_coordinator`
//! only to the package's own tests.

#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod admission;
mod faults;
mod in_process;
mod processes;
mod rounds;
mod scenarios;
mod tls;
mod util;
