//! Named network namespaces for the packet-level emulator: created and
//! removed with iproute2 (`ip netns add|del`, so operators can use
//! `ip netns exec` on them too), entered with `setns(2)` on a thread of
//! our own, which is how a TUN device, a socket or a child process comes
//! to live inside one.
//!
//! # Names
//!
//! `{prefix}-{pid}-{run}-{site}`: the process id and a per-process run
//! counter keep parallel emulators (tests in one process, several
//! processes) apart; the site name, cut to what a file name allows, tells
//! an operator which is which. A namespace is removed when its
//! [`Namespace`] is dropped, which a panic's unwinding also does; one left
//! behind by a process that was killed is removed by the next emulator
//! that starts with the same prefix ([`remove_stale`]).

use std::fs::File;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};

use super::super::EmulatorError;

/// Where iproute2 keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The longest an `ip` command may take before it is killed.
const IP_TIMEOUT: Duration = Duration::from_secs(20);
/// Linux capability numbers (`linux/capability.h`).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// One named network namespace; removed when dropped.
#[derive(Debug)]
pub struct Namespace {
    name: String,
    /// `/run/netns/NAME`, the handle `setns` takes.
    handle: File,
}

impl Namespace {
    /// Creates the namespace `name` and brings its loopback up.
    pub fn create(name: &str) -> Result<Self, EmulatorError> {
        run_ip(&["netns", "add", name])?;
        let path = PathBuf::from(NETNS_DIR).join(name);
        let handle = match File::open(&path) {
            Ok(handle) => handle,
            Err(source) => {
                let _ = run_ip(&["netns", "del", name]);
                return Err(EmulatorError::Io {
                    what: format!("cannot open network namespace {}", path.display()),
                    source,
                });
            }
        };
        let namespace = Self {
            name: name.to_string(),
            handle,
        };
        namespace.ip(&["link", "set", "lo", "up"])?;
        Ok(namespace)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...` in this namespace.
    pub fn ip(&self, args: &[&str]) -> Result<(), EmulatorError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Runs `work` on a thread that has joined this namespace, so that
    /// whatever it creates there (sockets, TUN devices, child processes)
    /// lives in the namespace; what it creates stays usable from any
    /// thread afterwards.
    pub fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> Result<T, EmulatorError> {
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name(format!("netns {}", self.name))
                .spawn_scoped(scope, || {
                    setns(&self.handle, CloneFlags::CLONE_NEWNET).map(|()| work())
                })
                .map_err(|source| EmulatorError::Io {
                    what: format!(
                        "cannot start a thread to enter network namespace {}",
                        self.name
                    ),
                    source,
                })?;
            match thread.join() {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(errno)) => Err(EmulatorError::Io {
                    what: format!("cannot enter network namespace {} (setns)", self.name),
                    source: errno.into(),
                }),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Starts `command` inside this namespace (its network only: files,
    /// processes and the user are the caller's).
    pub fn spawn(&self, command: &mut Command) -> Result<Child, EmulatorError> {
        let program = command.get_program().to_string_lossy().into_owned();
        self.run(|| command.spawn())?
            .map_err(|source| EmulatorError::Io {
                what: format!(
                    "cannot start {program:?} in network namespace {}",
                    self.name
                ),
                source,
            })
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(error) = run_ip(&["netns", "del", &self.name]) {
            tracing::warn!(%error, namespace = %self.name, "cannot remove a network namespace");
        }
    }
}

/// A namespace name: `{prefix}-{pid}-{run}-{site}`, the site cut to
/// letters, digits, `-` and `_` and to 32 characters; a site id that had to
/// be cut or changed gets `-{index}` (its place among the run's sites) after
/// it, so two ids that read the same once cut still name two namespaces.
pub fn namespace_name(prefix: &str, run: u64, index: usize, site: &str) -> String {
    let cut: String = site
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let pid = std::process::id();
    if cut == site {
        format!("{prefix}-{pid}-{run}-{cut}")
    } else {
        format!("{prefix}-{pid}-{run}-{cut}-{index}")
    }
}

/// Removes the namespaces named `{prefix}-{pid}-...` whose process is gone:
/// those a killed emulator left behind. Failures are logged only.
pub fn remove_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    let start = format!("{prefix}-");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&start)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || PathBuf::from(format!("/proc/{pid}")).exists() {
            continue;
        }
        match run_ip(&["netns", "del", &name]) {
            Ok(()) => {
                tracing::info!(namespace = %name, pid, "removed a network namespace left by a process that is gone")
            }
            Err(error) => {
                tracing::warn!(%error, namespace = %name, "cannot remove a stale network namespace")
            }
        }
    }
}

/// Checks what the packet-level mode needs before it touches anything:
/// CAP_SYS_ADMIN (network namespaces), CAP_NET_ADMIN (TUN devices and
/// addresses), `/dev/net/tun` and iproute2's `ip`. The error names
/// everything missing.
pub fn check_support() -> Result<(), EmulatorError> {
    let mut missing = Vec::new();
    match effective_capabilities() {
        Some(caps) => {
            if caps & (1 << CAP_SYS_ADMIN) == 0 {
                missing.push("CAP_SYS_ADMIN (to create network namespaces)".to_string());
            }
            if caps & (1 << CAP_NET_ADMIN) == 0 {
                missing.push("CAP_NET_ADMIN (to create TUN devices and set addresses)".to_string());
            }
        }
        None => missing.push(
            "a readable /proc/self/status (to check CAP_SYS_ADMIN and CAP_NET_ADMIN)".to_string(),
        ),
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun (the TUN driver, `modprobe tun`)".to_string());
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |status| !status.success())
    {
        missing.push("the `ip` command (Debian package iproute2)".to_string());
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(EmulatorError::PacketModeUnavailable {
            missing: missing.join(", "),
        })
    }
}

/// The effective capability set (`CapEff` of `/proc/self/status`).
fn effective_capabilities() -> Option<u64> {
    let mut status = String::new();
    File::open("/proc/self/status")
        .ok()?
        .read_to_string(&mut status)
        .ok()?;
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Runs `ip ARGS...`, killed after [`IP_TIMEOUT`]; an error carries the
/// command and what it printed.
fn run_ip(args: &[&str]) -> Result<(), EmulatorError> {
    let command_line = format!("ip {}", args.join(" "));
    let io = |source| EmulatorError::Io {
        what: format!("cannot run `{command_line}`"),
        source,
    };
    let mut child = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io)?;
    let deadline = Instant::now() + IP_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io)? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(EmulatorError::Command {
                command: command_line,
                message: format!("did not finish within {IP_TIMEOUT:?}"),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    if status.success() {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    Err(EmulatorError::Command {
        command: command_line,
        message: format!("{status}: {}", stderr.trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::namespace_name;

    #[test]
    fn names_keep_a_plain_site_id_and_tell_apart_ids_that_read_the_same_once_cut() {
        let pid = std::process::id();
        assert_eq!(
            namespace_name("lh", 0, 3, "south"),
            format!("lh-{pid}-0-south")
        );
        let long_a = format!("{}-a", "x".repeat(40));
        let long_b = format!("{}-b", "x".repeat(40));
        let (a, b) = (
            namespace_name("lh", 0, 0, &long_a),
            namespace_name("lh", 0, 1, &long_b),
        );
        assert_ne!(a, b);
        assert!(a.ends_with(&format!("{}-0", "x".repeat(32))), "{a}");
        // Characters `ip netns` would not take are replaced, and the index says so.
        assert_eq!(
            namespace_name("lh", 1, 2, "eu/west"),
            format!("lh-{pid}-1-eu_west-2")
        );
    }
}
