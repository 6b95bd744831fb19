//! longhaul's integration tests, as one binary (one link step, one place to
//! look). Modules:
//!
//! - `examples`: every bundled example parses, validates and round-trips.
//! - `validation`: table of invalid config files with the exact field path and
//!   line each error must name.
//! - `figures`: property tests of derived network figures and model invariants.
//! - `cli`: the `longhaul` binary as a user runs it.
//! - `wire`: the generated gRPC API and its reflection descriptor.
//! - `report`: the simulation report rendered by headless Chromium.
//! - `deploy`: the systemd units, Kubernetes manifests and Dockerfile under
//!   `deploy/`, checked offline, and the command lines in them.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an unexpected error should fail loudly, helpers included"
)]

mod util;

mod cli;
mod deploy;
mod examples;
mod figures;
mod report;
mod validation;
mod wire;
