//! Generates Rust from `proto/longhaul/v1/*.proto` with the vendored `protoc`,
//! so a fresh machine needs no system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/longhaul/v1/types.proto",
        "proto/longhaul/v1/coordinator.proto",
        "proto/longhaul/v1/agent.proto",
        "proto/longhaul/v1/raft.proto",
        "proto/longhaul/v1/emulator.proto",
        "proto/longhaul/v1/trainer.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("longhaul_v1_descriptor.bin"))
        .compile_with_config(config, &files, &["proto"])?;
    Ok(())
}
