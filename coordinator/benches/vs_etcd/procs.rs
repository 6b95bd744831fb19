//! Child processes that cannot outlive the benchmark, and free loopback ports.

use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

pub use longhaul_coordinator::process::KillOnDrop as Proc;

/// Spawns `command` with stdout and stderr written to `log`. Dropping the
/// process (also while unwinding from a panic) sends SIGKILL and reaps it,
/// so no replica survives the benchmark.
pub fn spawn(name: &str, command: &mut Command, log: &Path) -> io::Result<Proc> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    Proc::spawn(
        name,
        command.stdout(Stdio::from(out)).stderr(Stdio::from(err)),
    )
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
