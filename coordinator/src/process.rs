//! Child processes that cannot outlive their owner: the replicas and agents a
//! rehearsal starts, and the servers the process tests and benchmarks run.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

/// A spawned child process. Dropping it (also while unwinding from a panic)
/// sends SIGKILL and reaps it; [`KillOnDrop::kill`] does so earlier. The
/// child's standard input is closed; its output goes where the caller's
/// `Command` says.
#[derive(Debug)]
pub struct KillOnDrop {
    name: String,
    child: Option<Child>,
}

impl KillOnDrop {
    /// Spawns `command`; the error names the process.
    pub fn spawn(name: impl Into<String>, command: &mut Command) -> io::Result<Self> {
        let name = name.into();
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {name}: {e}")))?;
        Ok(Self {
            name,
            child: Some(child),
        })
    }

    /// The process id, while it is held.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL (what `Child::kill` sends on Unix) and reap: no shutdown path
    /// runs. Does nothing if it was killed already.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `Some(status)` if the process has exited on its own.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child.try_wait(),
            None => Ok(None),
        }
    }

    /// `Some(description)` if the process has exited on its own (or cannot
    /// be asked).
    pub fn exited(&mut self) -> Option<String> {
        match self.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited: {status}", self.name)),
            Ok(None) => None,
            Err(error) => Some(format!("{}: {error}", self.name)),
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `path` opened for appending (created if missing), for a child's output.
pub fn append_log(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_child_is_killed_and_reaped() {
        let mut sleeper = KillOnDrop::spawn("sleep", Command::new("sleep").arg("30"))
            .expect("sleep is on every machine");
        let pid = sleeper.id().expect("running");
        assert_eq!(sleeper.exited(), None);
        drop(sleeper);
        // Reaped: the pid is gone from /proc (or reused by another program,
        // which a zombie would prevent).
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!stat.contains("(sleep) Z"), "left a zombie: {stat}");
        assert!(!stat.contains("(sleep) S"), "still running: {stat}");
    }

    #[test]
    fn an_exit_is_reported_with_the_name() {
        let mut quick = KillOnDrop::spawn("true", &mut Command::new("true")).expect("true exists");
        let mut seen = None;
        for _ in 0..200 {
            seen = quick.exited();
            if seen.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(seen.as_deref(), Some("true exited: exit status: 0"));
    }

    #[test]
    fn a_missing_program_is_named_in_the_error() {
        let error = KillOnDrop::spawn("helper", &mut Command::new("/nonexistent/longhaul-x"))
            .expect_err("no such program");
        assert!(
            error.to_string().starts_with("cannot start helper: "),
            "{error}"
        );
    }
}
