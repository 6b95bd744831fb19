//! Real `coordinator` processes on loopback, killed with SIGKILL.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use crate::util::{KillOnDrop, client, eventually, free_addr, small_job};

/// One replica process; killed (SIGKILL) when dropped.
pub(crate) struct Process {
    pub(crate) id: u64,
    pub(crate) addr: SocketAddr,
    data_dir: PathBuf,
    cluster: String,
    pub(crate) child: Option<KillOnDrop>,
    pub(crate) extra_args: Vec<String>,
}

impl Process {
    pub(crate) fn start(&mut self) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_coordinator"));
        command
            .args(["--id", &self.id.to_string()])
            .args(["--listen", &self.addr.to_string()])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--initial-cluster", &self.cluster])
            .args(["--tick-interval", "20ms", "--election-ticks", "10"])
            .args(["--log", &replica_log_filter()])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(self.log_file());
        let name = format!("replica {}", self.id);
        self.child = Some(KillOnDrop::spawn(name, &mut command).unwrap());
    }

    /// SIGKILL: no shutdown path runs.
    pub(crate) fn kill(&mut self) {
        self.child = None;
    }

    /// The replica's log, beside its data directory, appended to across
    /// restarts.
    fn log_path(&self) -> PathBuf {
        self.data_dir.with_extension("log")
    }

    fn log_file(&self) -> Stdio {
        longhaul_coordinator::process::append_log(&self.log_path())
            .map_or_else(|_| Stdio::null(), Stdio::from)
    }
}

impl Process {
    /// The replica's `longhaul_raft_*` and proposal metrics, when it serves
    /// metrics (`--metrics-listen` among its arguments): read with a plain
    /// blocking request, as a failing test unwinds.
    fn raft_figures(&self) -> Option<String> {
        use std::io::{Read, Write};
        let at = self
            .extra_args
            .iter()
            .position(|a| a == "--metrics-listen")?;
        let addr: SocketAddr = self.extra_args.get(at + 1)?.parse().ok()?;
        let mut stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut body = String::new();
        let _ = stream.read_to_string(&mut body);
        let figures: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("longhaul_raft_") || l.starts_with("longhaul_proposals"))
            .collect();
        Some(figures.join("\n"))
    }
}

/// `LONGHAUL_TEST_REPLICA_LOG` (a tracing filter) when set, `warn` otherwise.
fn replica_log_filter() -> String {
    std::env::var("LONGHAUL_TEST_REPLICA_LOG").unwrap_or_else(|_| "warn".into())
}

impl Drop for Process {
    /// A failing test shows the end of each replica's log.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        if let Some(exited) = self.child.as_mut().and_then(KillOnDrop::exited) {
            eprintln!("--- {exited} before the test ended ---");
        } else if self.child.is_some()
            && let Some(figures) = self.raft_figures()
        {
            eprintln!("--- replica {} raft figures ---\n{figures}", self.id);
        }
        self.child = None;
        let Ok(log) = std::fs::read_to_string(self.log_path()) else {
            return;
        };
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(80)..];
        eprintln!(
            "--- replica {} log, last {} of {} lines ---",
            self.id,
            tail.len(),
            lines.len()
        );
        for line in tail {
            eprintln!("{line}");
        }
    }
}

pub(crate) fn cluster(dir: &Path, n: u64) -> Vec<Process> {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let spec: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}=http://{a}", i + 1))
        .collect();
    let spec = spec.join(",");
    addrs
        .into_iter()
        .enumerate()
        .map(|(i, addr)| Process {
            id: i as u64 + 1,
            addr,
            data_dir: dir.join(format!("replica-{}", i + 1)),
            cluster: spec.clone(),
            child: None,
            extra_args: Vec::new(),
        })
        .collect()
}

pub(crate) async fn leader(processes: &[Process]) -> u64 {
    eventually(
        Duration::from_secs(30),
        "a leader among running replicas",
        || async {
            for p in processes.iter().filter(|p| p.child.is_some()) {
                let mut c = client(p.addr).await;
                let Ok(cluster) = c
                    .get_cluster(pb::GetClusterRequest { allow_stale: true })
                    .await
                else {
                    continue;
                };
                let leader = cluster.into_inner().leader_id;
                if processes
                    .iter()
                    .any(|q| q.id == leader && q.child.is_some())
                {
                    return Some(leader);
                }
            }
            None
        },
    )
    .await
}

fn job(name: &str) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(small_job(name)),
        expected_revision: 0,
    }
}

/// Submits a job with a deadline; `Some(true)` when acknowledged.
async fn submit(c: &mut CoordinatorClient<Channel>, name: &str) -> bool {
    let mut request = tonic::Request::new(job(name));
    request.set_timeout(Duration::from_secs(2));
    c.submit_job(request).await.is_ok()
}

async fn job_names(addr: SocketAddr) -> BTreeSet<String> {
    eventually(
        Duration::from_secs(30),
        "a linearizable job list",
        || async {
            let mut c = client(addr).await;
            let jobs = c
                .list_jobs(pb::ListJobsRequest { allow_stale: false })
                .await
                .ok()?;
            Some(jobs.into_inner().jobs.into_iter().map(|j| j.id).collect())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_rejoins_without_losing_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut processes = cluster(dir.path(), 3);
    for p in &mut processes {
        p.start();
    }
    let first = leader(&processes).await;
    let mut acknowledged = BTreeSet::new();
    // Writes go to any replica: followers forward them.
    let mut c = client(processes[0].addr).await;
    for i in 0..20 {
        let name = format!("before-{i}");
        if submit(&mut c, &name).await {
            acknowledged.insert(name);
        }
    }
    assert_eq!(
        acknowledged.len(),
        20,
        "a healthy cluster acknowledges every write"
    );

    processes[first as usize - 1].kill();
    let second = leader(&processes).await;
    assert_ne!(second, first);
    let mut c = client(processes[second as usize - 1].addr).await;
    for i in 0..20 {
        let name = format!("after-{i}");
        if submit(&mut c, &name).await {
            acknowledged.insert(name);
        }
    }
    assert_eq!(acknowledged.len(), 40, "the new leader serves writes");

    // The old leader restarts from its store, follows the new leader and
    // serves every acknowledged write.
    processes[first as usize - 1].start();
    let old = processes[first as usize - 1].addr;
    let names = eventually(
        Duration::from_secs(30),
        "the old leader to catch up",
        || async {
            let names = job_names(old).await;
            acknowledged.is_subset(&names).then_some(names)
        },
    )
    .await;
    assert!(acknowledged.is_subset(&names));
    let mut c = client(old).await;
    let cluster = c
        .get_cluster(pb::GetClusterRequest { allow_stale: true })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        cluster.leader_id, first,
        "the old leader rejoined as a follower"
    );
}

/// Seeded kill points; `LONGHAUL_SEED` replays one, `LONGHAUL_CRASH_ITERATIONS`
/// runs more (CI runs a few; a longer run uses hundreds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_minus_nine_at_random_points() {
    let seed: u64 = std::env::var("LONGHAUL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261129);
    let iterations: u64 = std::env::var("LONGHAUL_CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    eprintln!(
        "crash durability: seed {seed}, {iterations} iterations (replay with LONGHAUL_SEED={seed})"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut processes = cluster(dir.path(), 1);
    let mut acknowledged = BTreeSet::new();
    let mut rng = seed;
    for iteration in 0..iterations {
        processes[0].start();
        let addr = processes[0].addr;
        leader(&processes).await;
        // Kill after a pseudo-random delay while writers are busy.
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(50 + (rng >> 33) % 400);
        let writers: Vec<_> = (0..4)
            .map(|w| {
                tokio::spawn(async move {
                    let mut c = client(addr).await;
                    let mut acked = Vec::new();
                    for i in 0.. {
                        let name = format!("it{iteration}-w{w}-{i}");
                        if submit(&mut c, &name).await {
                            acked.push(name);
                        } else {
                            break;
                        }
                    }
                    acked
                })
            })
            .collect();
        tokio::time::sleep(kill_after).await;
        processes[0].kill();
        for writer in writers {
            acknowledged.extend(writer.await.unwrap());
        }
        // Restart and check that nothing acknowledged is missing.
        processes[0].start();
        leader(&processes).await;
        let present = job_names(processes[0].addr).await;
        let missing: Vec<_> = acknowledged.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "seed {seed}, iteration {iteration}: acknowledged writes lost after kill -9: {missing:?}"
        );
        processes[0].kill();
    }
    assert!(
        !acknowledged.is_empty(),
        "seed {seed}: no write was acknowledged at all"
    );
}

/// `GET path` over plain HTTP/1.0; returns the body.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    // HTTP/1.1 with `Connection: close`, so the server ends the response.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .ok()?
        .ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.lines()
        .next()?
        .contains(" 200 ")
        .then(|| body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_for_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let mut processes = cluster(dir.path(), 1);
    let metrics = free_addr();
    processes[0].extra_args = vec!["--metrics-listen".into(), metrics.to_string()];
    processes[0].start();
    leader(&processes).await;
    let mut c = client(processes[0].addr).await;
    assert!(submit(&mut c, "measured").await);
    let body = eventually(Duration::from_secs(10), "the metrics endpoint", || {
        http_get(metrics, "/metrics")
    })
    .await;
    for name in [
        "longhaul_raft_term",
        "longhaul_raft_is_leader 1",
        "longhaul_leader_changes_total",
        "longhaul_proposals_committed_total 1",
        "longhaul_commit_latency_seconds",
        "longhaul_fsync_seconds",
        "longhaul_apply_seconds",
    ] {
        assert!(body.contains(name), "{name} missing from\n{body}");
    }
}

/// The figures of the `opened the store` line of a replica's log:
/// (applied, last index), the last time it opened.
fn opened(log: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("opened the store"))?;
    let field = |name: &str| -> Option<u64> {
        let rest = line.split(&format!("{name}=")).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((field("applied")?, field("last_index")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// SIGTERM (what systemd and Kubernetes send) stops the replica through its
/// shutdown path: exit status 0, the store closed, every write there after
/// the restart. (Whether the close itself committed the applied state cannot
/// be told from outside: the 100 ms sync usually has by then.)
async fn sigterm_stops_a_replica_cleanly_and_a_restart_finds_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let log = dir.path().join("replica.log");
    let start = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_coordinator"));
        command
            .args(["--id", "1", "--listen", &addr.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("replica-1"))
            .args(["--tick-interval", "20ms", "--election-ticks", "10"])
            .args(["--log", "info"])
            .stdout(Stdio::null())
            .stderr(crate::util::append_log(&log).unwrap());
        KillOnDrop::spawn("replica 1", &mut command).unwrap()
    };
    let mut replica = start();
    let mut c = client(addr).await;
    eventually(Duration::from_secs(30), "the first write", || {
        let mut c = c.clone();
        async move { submit(&mut c, "first").await.then_some(()) }
    })
    .await;
    for i in 0..20 {
        assert!(submit(&mut c, &format!("job-{i}")).await);
    }
    let pid = replica.id().unwrap();
    // The shell's own `kill`: no package needed.
    let status = Command::new("sh")
        .args(["-c", &format!("kill -TERM {pid}")])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = eventually(Duration::from_secs(30), "the replica to exit", || {
        let exited = replica.try_wait().unwrap();
        async move { exited }
    })
    .await;
    assert!(exited.success(), "exit status {exited}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("terminated; stopping"), "{text}");

    drop(replica);
    let _replica = start();
    let (applied, last) = eventually(Duration::from_secs(30), "the restart's log", || async {
        let text = std::fs::read_to_string(&log).ok()?;
        (text.matches("opened the store").count() == 2).then_some(())?;
        opened(&log)
    })
    .await;
    assert!(applied >= 21, "applied {applied}");
    assert_eq!(applied, last, "the applied state is as durable as the log");
    assert_eq!(job_names(addr).await.len(), 21);
}
