//! The Python package's own tests (`site-agent/python/tests`, stdlib
//! `unittest`), run from `cargo test` so that one command runs every
//! test, and a check that the committed gRPC stubs are what
//! `generate.sh` makes of `trainer.proto` today.
//!
//! Needs Python 3 with `grpcio`, `protobuf` and `numpy` (and
//! `grpcio-tools` for the stub check); `.ci/run` installs them. Without
//! them the tests say so and pass, unless `LONGHAUL_REQUIRE_PYTHON=1`.
//! The PyTorch adapter's tests run where the interpreter imports torch
//! (skipped, saying so, elsewhere). `LONGHAUL_PYTHON` names another
//! interpreter (default `python3`).

#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// `LONGHAUL_PYTHON` or `python3`.
fn python() -> String {
    std::env::var("LONGHAUL_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Whether `python3` can import `modules`; panics instead of `false` under
/// `LONGHAUL_REQUIRE_PYTHON=1`.
fn can_import(modules: &str) -> bool {
    let output = Command::new(python())
        .args(["-c", &format!("import {modules}")])
        .env("PYTHONPATH", package())
        .output();
    let missing = match output {
        Ok(output) if output.status.success() => return true,
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_string(),
        Err(error) => format!("no {}: {error}", python()),
    };
    if std::env::var("LONGHAUL_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
        panic!("LONGHAUL_REQUIRE_PYTHON=1, but python3 cannot import {modules}: {missing}");
    }
    eprintln!("skipped: {} cannot import {modules}: {missing}", python());
    false
}

#[test]
fn the_python_packages_unit_tests_pass() {
    if !can_import("grpc, numpy, google.protobuf") {
        return;
    }
    let output = Command::new(python())
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(package())
        .env("PYTHONPATH", package())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python unit tests failed:\n{stderr}"
    );
    assert!(stderr.contains("OK"), "{stderr}");
    // "OK (skipped=N)" where torch is missing: say so in the test's output.
    eprintln!("{}", stderr.trim_end().lines().last().unwrap_or_default());
}

#[test]
fn the_committed_stubs_are_generated_from_todays_proto() {
    if !can_import("grpc_tools") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let mut args = vec![
        "-m".to_string(),
        "grpc_tools.protoc".to_string(),
        format!("-I{}", proto.display()),
    ];
    for kind in ["python_out", "grpc_python_out", "pyi_out"] {
        args.push(format!("--{kind}={}", out.path().display()));
    }
    args.push("longhaul/v1/trainer.proto".to_string());
    let status = Command::new(python())
        .args(&args)
        .current_dir(&proto)
        .status()
        .unwrap();
    assert!(status.success());
    for file in ["trainer_pb2.py", "trainer_pb2.pyi", "trainer_pb2_grpc.py"] {
        let fresh = std::fs::read_to_string(out.path().join("longhaul/v1").join(file)).unwrap();
        let committed = std::fs::read_to_string(package().join("longhaul/v1").join(file)).unwrap();
        assert!(
            fresh == committed,
            "site-agent/python/longhaul/v1/{file} is not what trainer.proto generates today: run site-agent/python/generate.sh"
        );
    }
}
