//! Child processes that cannot outlive the benchmark, and free loopback ports.

use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A spawned server process. Dropping it (also while unwinding from a panic)
/// sends SIGKILL and reaps it, so no replica survives the benchmark.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
}

impl Proc {
    /// Spawns `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> io::Result<Self> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {name}: {e}")))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
        })
    }

    /// SIGKILL (`Child::kill` sends SIGKILL on Unix) and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `Some(description)` if the process has exited on its own.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited: {status}", self.name)),
            Ok(None) => None,
            Err(error) => Some(format!("{}: {error}", self.name)),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
