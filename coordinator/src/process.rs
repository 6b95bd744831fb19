//! Child processes that cannot outlive their owner: the replicas and agents a
//! rehearsal starts, and the servers the process tests and benchmarks run;
//! and the loopback ports they are given ([`free_loopback_port`]).

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::ops::Range;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

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

/// A port on 127.0.0.1 in `range` that was free for both TCP and UDP a
/// moment ago, for a process started next to bind (a replica's gRPC port,
/// an agent's QUIC data port and TCP status port).
///
/// `range` should lie below the kernel's ephemeral range (32768 and up on
/// Linux): a port from `bind(0)` comes from that range, which outgoing
/// connections draw from too, so one of the many connections around could
/// take it between the pick and the process's bind ("address already in
/// use"). Ports are tried in turn from a start that differs per process
/// (its pid and the clock), so processes picking side by side rarely try
/// the same ones; a range with none free falls back to what `bind(0)`
/// offers, checked free for UDP too.
pub fn free_loopback_port(range: Range<u16>) -> io::Result<SocketAddr> {
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let free = |port: u16| {
        let tcp = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).ok()?;
        let addr = tcp.local_addr().ok()?;
        UdpSocket::bind(addr).ok()?;
        Some(addr)
    };
    let span = u32::from(range.end.saturating_sub(range.start));
    if span > 0 {
        let start = *START.get_or_init(|| {
            std::process::id().wrapping_mul(7_919)
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos())
        });
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let offset = start.wrapping_add(n) % span;
            let port = range.start + u16::try_from(offset).unwrap_or(0);
            if let Some(addr) = free(port) {
                return Ok(addr);
            }
        }
    }
    for _ in 0..64 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if let Some(addr) = free(port) {
            return Ok(addr);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no port on 127.0.0.1 is free for both TCP and UDP",
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    /// Three consecutive ports free for TCP and UDP, below the ranges the
    /// rehearsals and the test kit use and below the ephemeral range (a
    /// port in it may be taken by any outgoing connection meanwhile).
    fn three_free() -> u16 {
        (5_000..10_000u16)
            .step_by(7)
            .find(|&p| {
                (p..p + 3).all(|q| {
                    TcpListener::bind(("127.0.0.1", q)).is_ok()
                        && UdpSocket::bind(("127.0.0.1", q)).is_ok()
                })
            })
            .expect("three free ports")
    }

    #[test]
    fn ports_come_from_the_range_in_turn_and_never_one_bound_for_udp() {
        // One test: the calls share the process's counter.
        let first = three_free();
        let ports: std::collections::BTreeSet<u16> = (0..3)
            .map(|_| free_loopback_port(first..first + 3).unwrap().port())
            .collect();
        assert_eq!(ports, (first..first + 3).collect());
        // Every port of the range but one taken for UDP (TCP free on all
        // three): only that one comes back, however many times.
        let held = [
            UdpSocket::bind(("127.0.0.1", first)).unwrap(),
            UdpSocket::bind(("127.0.0.1", first + 2)).unwrap(),
        ];
        for _ in 0..6 {
            let addr = free_loopback_port(first..first + 3).unwrap();
            assert_eq!(addr.port(), first + 1, "{addr}");
        }
        drop(held);
        // An empty range: whatever the kernel offers, free for both.
        let addr = free_loopback_port(first..first).unwrap();
        UdpSocket::bind(addr).unwrap();
        TcpListener::bind(addr).unwrap();
    }

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
