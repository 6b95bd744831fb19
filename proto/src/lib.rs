//! Generated code for longhaul's wire API (`longhaul.v1`).
//!
//! This crate holds generated types only. Conversions between these messages
//! and the core model live at the service boundary, in the crates that serve
//! or call the API; the core never depends on this crate.

#![allow(
    missing_docs,
    unused_qualifications,
    missing_debug_implementations,
    clippy::all,
    reason = "generated code"
)]

/// Version 1 of the API.
pub mod v1 {
    tonic::include_proto!("longhaul.v1");

    /// Encoded `FileDescriptorSet` of every `longhaul.v1` file, for gRPC
    /// server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("longhaul_v1_descriptor");
}
