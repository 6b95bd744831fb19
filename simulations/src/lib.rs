//! longhaul's network emulation and simulation.
//!
//! [`link`] is the sans-IO link model: one direction of a WAN link as a state
//! machine in virtual time with a seeded RNG, to be driven by a real-time
//! proxy or a discrete-event simulator. [`emulator`] is that real-time
//! driver: UDP and TCP proxies on loopback, or (as root, on Linux) site
//! network namespaces behind TUN devices, whose packets go through the link
//! model, with a gRPC control API. [`analytic`] is the simulator's analytical
//! tier: one training step of each cross-site mode, from the placement cost
//! model and the sync planner, at every point of a sweep; [`report`] draws
//! a sweep as an HTML page with SVG charts. [`des`] is the discrete-event
//! tier: flows over Reno-like or paced connections through the same link
//! model, for a transfer between two sites or an outer round among many.

pub mod analytic;
pub mod des;
pub mod emulator;
pub mod link;
pub mod report;

pub use link::{Delivery, DropCause, Fate, Link, LinkConfig, LinkConfigError};
