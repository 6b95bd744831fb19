//! Running the scheduler's commands (`scontrol`, `kubectl`) with a deadline.
//! A command that hangs (a controller that does not answer) is killed when
//! its time is up; whatever it wrote to stderr goes into the error.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::InventoryError;

/// Stderr kept in an error, in bytes: enough for any real message.
const STDERR_LIMIT: usize = 4096;

/// How often a running command is checked.
const POLL: Duration = Duration::from_millis(10);

/// The command line as it is shown in errors.
pub fn display(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `program args...` with no stdin and returns its stdout. Fails when the
/// program cannot start, exits unsuccessfully, prints non-UTF-8, or is still
/// running after `timeout` (it is then killed).
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, InventoryError> {
    let command = display(program, args);
    let failed = |reason: String, stderr: String| InventoryError::Command {
        command: command.clone(),
        reason,
        stderr,
    };
    let mut child =
        spawn(program, args).map_err(|e| failed(format!("could not start: {e}"), String::new()))?;

    // Both pipes are drained on their own threads so that a command writing
    // a lot to one of them never blocks on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;

    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                kill(&mut child);
                let stderr = collect(&stderr, Instant::now() + POLL);
                return Err(failed(
                    format!(
                        "timed out after {:.1} s and was killed",
                        timeout.as_secs_f64()
                    ),
                    stderr_text(&stderr),
                ));
            }
            Ok(None) => thread::sleep(POLL),
            Err(e) => {
                kill(&mut child);
                return Err(failed(
                    format!("could not be waited for: {e}"),
                    String::new(),
                ));
            }
        }
    };

    // The process has exited; its pipes close unless it left children
    // holding them, so the reads are bounded by the same deadline.
    let grace = deadline.max(Instant::now() + POLL);
    let out = collect(&stdout, grace);
    let err = stderr_text(&collect(&stderr, grace));
    if !status.success() {
        return Err(failed(format!("failed ({status})"), err));
    }
    String::from_utf8(out).map_err(|_| failed("printed output that is not UTF-8".to_string(), err))
}

/// Starts the command. A program that is still open for writing somewhere
/// (a wrapper script just written, or a fork of another thread that has not
/// yet exec'd) fails with "text file busy" for a moment; that is retried.
fn spawn(program: &str, args: &[&str]) -> std::io::Result<Child> {
    let mut attempts = 0;
    loop {
        let result = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 5 => {
                attempts += 1;
                thread::sleep(POLL * 5);
            }
            other => return other,
        }
    }
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut buffer = Vec::new();
            // A read error ends the output early; the exit status tells the rest.
            let _ = pipe.read_to_end(&mut buffer);
            let _ = sender.send(buffer);
        });
    }
    receiver
}

fn collect(receiver: &mpsc::Receiver<Vec<u8>>, deadline: Instant) -> Vec<u8> {
    receiver
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .unwrap_or_default()
}

fn kill(child: &mut Child) {
    // The process may have exited in between; either way it is reaped.
    let _ = child.kill();
    let _ = child.wait();
}

fn stderr_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= STDERR_LIMIT {
        return text.to_string();
    }
    let mut end = STDERR_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_stdout() {
        let out = run("sh", &["-c", "echo hello"], Duration::from_secs(10)).unwrap();
        assert_eq!(out, "hello\n");
    }

    #[test]
    fn a_failing_command_reports_its_status_and_stderr() {
        let error = run(
            "sh",
            &["-c", "echo 'no controller' >&2; exit 3"],
            Duration::from_secs(10),
        )
        .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`sh -c"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("stderr: no controller"), "{text}");
    }

    #[test]
    fn a_hanging_command_is_killed_at_its_deadline() {
        let started = Instant::now();
        let error = run(
            "sh",
            &["-c", "echo waiting >&2; exec sleep 30"],
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let text = error.to_string();
        assert!(text.contains("timed out after 0.3 s"), "{text}");
        assert!(text.contains("stderr: waiting"), "{text}");
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_panic() {
        let error = run(
            "/nonexistent/longhaul-no-such-binary",
            &["show"],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(error.to_string().contains("could not start"), "{error}");
    }
}
