//! Generated code for longhaul's wire API (`longhaul.v1`), and the one set
//! of conversions between its messages and the core model ([`convert`]).
//! The core never depends on this crate.

pub mod convert;
pub mod rounds;

/// Version 1 of the API.
#[allow(
    missing_docs,
    unused_qualifications,
    missing_debug_implementations,
    clippy::all,
    reason = "generated code"
)]
pub mod v1 {
    tonic::include_proto!("longhaul.v1");

    /// Encoded `FileDescriptorSet` of every `longhaul.v1` file, for gRPC
    /// server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("longhaul_v1_descriptor");
}
