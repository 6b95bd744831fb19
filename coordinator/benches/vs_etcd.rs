//! longhaul's coordinator against etcd, on the same machine, in one run.
//!
//! Two three-member clusters on 127.0.0.1, each member a real process with
//! its own temp data dir: longhaul's `coordinator` binary (built by cargo for
//! this bench, `CARGO_BIN_EXE_coordinator`) and `etcd` (Debian's
//! `etcd-server`). Both fsync their log before a write is acknowledged
//! (etcd's WAL; longhaul's log file) and make the applied state durable in
//! batches (etcd's backend, longhaul's state file, each every 100 ms), and
//! run the same election timing: heartbeat 100 ms, election timeout 1 s,
//! pre-vote on.
//!
//! 1. Writes: for 1, 16 and 256 concurrent closed-loop clients, each client
//!    writes one small command after another to the leader for a fixed
//!    window; throughput and p50/p99 commit latency per system, and the
//!    ratio longhaul / etcd. Client counts alternate between the systems so
//!    background load hits both alike.
//!    - longhaul: `SubmitJob` of a uniquely named job (the public write RPC
//!      that needs no registered sites); the replicated raft entry is the
//!      command's JSON, whose size is printed.
//!    - etcd: `KV/Put` of a unique key whose key + value bytes equal that size.
//! 2. Failover: on a fresh idle cluster, SIGKILL the leader and time until the
//!    first write succeeds on a survivor (an attempt starts every 5 ms,
//!    alternating survivors); median over several rounds.
//!
//! Run (release profile):
//!
//! ```text
//! cargo bench -p longhaul-coordinator --bench vs_etcd
//! ```
//!
//! Environment: `VS_ETCD_SECONDS` (measured window per phase, default 10),
//! `VS_ETCD_WARMUP` (seconds before it, default 1), `VS_ETCD_CLIENTS`
//! (default `1,16,256`), `VS_ETCD_FAILOVERS` (rounds, default 5),
//! `VS_ETCD_BIN` (default `etcd` on `PATH`), `VS_ETCD_COORDINATOR_BIN`
//! (default: the `coordinator` cargo built, e.g. to compare a saved older
//! build). Not run in CI.
//!
//! After each phase it prints the CPU time the three members used per write
//! (from `/proc`, so for both systems alike; less at the mercy of other load
//! than throughput), and, per member, what a committed entry cost from the
//! members' own metrics (fsyncs, deferred commits, Ready passes; etcd's WAL
//! fsyncs and backend commits), to show where the time goes.

#[path = "vs_etcd/cluster.rs"]
mod cluster;
#[path = "vs_etcd/etcd_api.rs"]
mod etcd_api;
#[path = "vs_etcd/metrics.rs"]
mod metrics;
#[path = "vs_etcd/procs.rs"]
mod procs;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cluster::{Binaries, Cluster, ELECTION_MS, HEARTBEAT_MS, Payload, System, Writer, etcd_key};
use longhaul_core::state::{Command, Placement, Request};
use longhaul_proto::v1 as pb;
use tokio::task::JoinSet;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// No single phase or the whole run may hang.
const RUN_LIMIT: Duration = Duration::from_secs(20 * 60);
const READY_LIMIT: Duration = Duration::from_secs(30);
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections per system: one per client up to this many, shared beyond.
const MAX_CONNECTIONS: usize = 8;

#[derive(Debug, Clone)]
struct Settings {
    seconds: u64,
    warmup: u64,
    clients: Vec<usize>,
    failovers: usize,
    bins: Binaries,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|_| format!("{name}: cannot parse {text:?}").into()),
    }
}

fn settings() -> Result<Settings, BoxError> {
    let clients = match std::env::var("VS_ETCD_CLIENTS") {
        Err(_) => vec![1, 16, 256],
        Ok(text) => text
            .split(',')
            .map(|c| c.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("VS_ETCD_CLIENTS: expected e.g. 1,16,256, found {text:?}"))?,
    };
    if clients.contains(&0) {
        return Err("VS_ETCD_CLIENTS: client counts must be positive".into());
    }
    Ok(Settings {
        seconds: env_or("VS_ETCD_SECONDS", 10)?.max(1),
        warmup: env_or("VS_ETCD_WARMUP", 1)?,
        clients,
        failovers: env_or("VS_ETCD_FAILOVERS", 5)?,
        bins: Binaries {
            coordinator: PathBuf::from(env_or(
                "VS_ETCD_COORDINATOR_BIN",
                env!("CARGO_BIN_EXE_coordinator").to_string(),
            )?),
            etcd: PathBuf::from(env_or("VS_ETCD_BIN", "etcd".to_string())?),
        },
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// A job name of fixed length, unique per (tag, client, seq), valid as a
/// longhaul id.
fn name(tag: usize, client: usize, seq: u64) -> String {
    format!("bench-{tag:02}-{client:04}-{seq:010}")
}

/// The job every longhaul write submits (renamed per write): the 70B example's shape.
fn job_template() -> pb::JobSpec {
    pb::JobSpec {
        name: name(0, 0, 0),
        model: Some(pb::ModelShape {
            parameters: 70_600_000_000,
            layers: 80,
            hidden_size: 8192,
            attention_heads: 64,
            sequence_length: 8192,
            vocabulary_size: 0,
            kv_heads: 0,
            moe: None,
        }),
        global_batch: 1024,
        micro_batch: 1,
        ..pb::JobSpec::default()
    }
}

/// Size of longhaul's replicated command for one write: the JSON the raft
/// entry carries, computed exactly as the service builds it.
fn longhaul_command_bytes(job: &pb::JobSpec) -> Result<usize, BoxError> {
    let spec = longhaul_coordinator::server::convert::job_from_wire(job, "spec")
        .map_err(|s| format!("job template: {}", s.message()))?;
    let request = Request::new(Command::SubmitJob {
        job_id: spec.name.clone(),
        spec,
        placement: Placement::Pending,
    });
    Ok(serde_json::to_vec(&request)?.len())
}

#[derive(Debug, Clone, Default)]
struct PhaseResult {
    ops: u64,
    errors: u64,
    window: Duration,
    /// Commit latencies in µs, sorted.
    latencies: Vec<u32>,
    loadavg: String,
    /// CPU ms all members used per write.
    cpu_ms_per_write: f64,
}

impl PhaseResult {
    fn throughput(&self) -> f64 {
        self.ops as f64 / self.window.as_secs_f64()
    }

    /// Nearest-rank percentile in ms.
    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank =
            ((p * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        f64::from(self.latencies[rank - 1]) / 1000.0
    }
}

/// Closed-loop clients against the leader: each writes, waits for the
/// commit, writes again. Completions inside the window after the warm-up
/// count; their latencies are kept.
async fn run_phase(
    pool: &[Writer],
    clients: usize,
    tag: usize,
    warmup: Duration,
    window: Duration,
) -> PhaseResult {
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + window;
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let mut writer = pool[client % pool.len()].clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut seq = 0u64;
            while Instant::now() < end {
                seq += 1;
                let sent = Instant::now();
                let result = writer.write(&name(tag, client, seq), WRITE_TIMEOUT).await;
                let done = Instant::now();
                let counted = done >= measure_from && done < end;
                match result {
                    Ok(()) if counted => {
                        latencies
                            .push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX));
                    }
                    Ok(()) => {}
                    Err(_) => {
                        if counted {
                            errors += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (latencies, errors)
        });
    }
    let mut result = PhaseResult {
        window,
        ..PhaseResult::default()
    };
    while let Some(joined) = tasks.join_next().await {
        if let Ok((latencies, errors)) = joined {
            result.ops += latencies.len() as u64;
            result.errors += errors;
            result.latencies.extend(latencies);
        } else {
            result.errors += 1;
        }
    }
    result.latencies.sort_unstable();
    result.loadavg = loadavg();
    result
}

/// A write pool of connections to the current leader.
async fn leader_pool(
    cluster: &Cluster,
    payload: &Payload,
    clients: usize,
) -> Result<Vec<Writer>, BoxError> {
    let leader = cluster.leader(READY_LIMIT).await?;
    let mut pool = Vec::new();
    for _ in 0..clients.min(MAX_CONNECTIONS) {
        pool.push(cluster.writer(leader, payload).await?);
    }
    Ok(pool)
}

/// One failover round on a fresh cluster: time from SIGKILL of the leader
/// to the first successful write on a survivor.
async fn failover_once(
    system: System,
    settings: &Settings,
    payload: &Payload,
) -> Result<(Duration, u64), BoxError> {
    let mut cluster = Cluster::start(system, &settings.bins)?;
    cluster.wait_ready(payload, READY_LIMIT).await?;
    // Let the cluster settle (followers caught up, heartbeats flowing).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = cluster.leader(READY_LIMIT).await?;
    let mut survivors = Vec::new();
    for i in (0..3).filter(|i| *i != leader) {
        survivors.push(cluster.writer(i, payload).await?);
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut attempts = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let killed = Instant::now();
    cluster.kill(leader);
    let mut n = 0u64;
    let elapsed = loop {
        tokio::select! {
            Some(elapsed) = rx.recv() => break elapsed,
            _ = tick.tick() => {
                if killed.elapsed() > FAILOVER_LIMIT {
                    return Err(format!(
                        "{}: no write succeeded within {FAILOVER_LIMIT:?} of killing the leader (logs in {})",
                        system.name(),
                        cluster.log_dir().display()
                    ).into());
                }
                let mut writer = survivors[(n as usize) % survivors.len()].clone();
                let tx = tx.clone();
                let key = name(99, 0, n);
                n += 1;
                attempts.spawn(async move {
                    if writer.write(&key, Duration::from_secs(2)).await.is_ok() {
                        let _ = tx.send(killed.elapsed());
                    }
                });
            }
        }
    };
    attempts.abort_all();
    Ok((elapsed, n))
}

fn median(values: &mut [Duration]) -> Option<Duration> {
    values.sort_unstable();
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2),
    }
}

fn etcd_version(bin: &PathBuf) -> Result<String, BoxError> {
    let output = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} ({e}); install Debian's etcd-server or set VS_ETCD_BIN",
                bin.display()
            )
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or("unknown")
        .trim()
        .to_string())
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

async fn run(settings: Settings) -> Result<(), BoxError> {
    let version = etcd_version(&settings.bins.etcd)?;
    let job = job_template();
    let command_bytes = longhaul_command_bytes(&job)?;
    let key_bytes = etcd_key(&name(0, 0, 0)).len();
    let payload = Payload {
        job,
        etcd_value: vec![b'v'; command_bytes.saturating_sub(key_bytes)],
    };
    println!(
        "longhaul vs etcd {version}: 3 members each on 127.0.0.1, log fsync on every write, heartbeat {HEARTBEAT_MS} ms, election timeout {ELECTION_MS} ms, pre-vote on"
    );
    println!(
        "write: longhaul SubmitJob (raft entry: {command_bytes} B of JSON) | etcd Put (key {key_bytes} B + value {} B = {command_bytes} B)",
        payload.etcd_value.len()
    );
    println!(
        "phases: {} s measured after {} s warm-up, clients {:?}, closed loop to the leader over up to {MAX_CONNECTIONS} connections; {} cores, load average at start {}",
        settings.seconds,
        settings.warmup,
        settings.clients,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );

    // Throughput and latency.
    let mut results: Vec<(usize, PhaseResult, PhaseResult)> = Vec::new();
    if !settings.clients.is_empty() {
        let mut longhaul = Cluster::start(System::Longhaul, &settings.bins)?;
        let mut etcd = Cluster::start(System::Etcd, &settings.bins)?;
        longhaul.wait_ready(&payload, READY_LIMIT).await?;
        etcd.wait_ready(&payload, READY_LIMIT).await?;
        for (tag, &clients) in settings.clients.iter().enumerate() {
            let mut pair = Vec::new();
            for cluster in [&mut longhaul, &mut etcd] {
                let pool = leader_pool(cluster, &payload, clients).await?;
                let before = cluster.scrape().await;
                let cpu_before = cluster.cpu_seconds();
                let result = run_phase(
                    &pool,
                    clients,
                    tag + 1,
                    Duration::from_secs(settings.warmup),
                    Duration::from_secs(settings.seconds),
                )
                .await;
                cluster.check_alive()?;
                // Over warm-up and window alike, so per write of both at the window's rate.
                let cpu = cluster.cpu_seconds() - cpu_before;
                let phase_writes =
                    result.throughput() * (settings.warmup + settings.seconds) as f64;
                let cpu_ms_per_write = 1000.0 * cpu / phase_writes;
                let result = PhaseResult {
                    cpu_ms_per_write,
                    ..result
                };
                println!(
                    "  {:>8} {clients:>4} clients: {:>8.0} writes/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}  cpu {:.3} ms/write (3 members)  (load {})",
                    cluster.system.name(),
                    result.throughput(),
                    result.percentile_ms(0.50),
                    result.percentile_ms(0.99),
                    result.errors,
                    cpu_ms_per_write,
                    result.loadavg
                );
                let after = cluster.scrape().await;
                let leader = cluster.leader(READY_LIMIT).await.ok();
                for (i, (before, after)) in before.iter().zip(&after).enumerate() {
                    let role = if Some(i) == leader {
                        "leader"
                    } else {
                        "follower"
                    };
                    println!(
                        "           {}",
                        metrics::describe(cluster.system, role, before, after)
                    );
                }
                pair.push(result);
            }
            let etcd_result = pair.pop().unwrap_or_default();
            let longhaul_result = pair.pop().unwrap_or_default();
            results.push((clients, longhaul_result, etcd_result));
        }
    }

    // Failover.
    let mut failovers: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..settings.failovers {
        for (i, system) in [System::Longhaul, System::Etcd].into_iter().enumerate() {
            let (elapsed, attempts) = failover_once(system, &settings, &payload).await?;
            println!(
                "  failover {} round {}: first write {:.0} ms after SIGKILL ({attempts} attempts, load {})",
                system.name(),
                round + 1,
                elapsed.as_secs_f64() * 1000.0,
                loadavg()
            );
            failovers[i].push(elapsed);
        }
    }

    // The table.
    println!();
    println!(
        "{:>7} | {:>12} {:>12} {:>6} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6} | {:>7} | {:>18} | {:>14}",
        "clients",
        "longhaul w/s",
        "etcd w/s",
        "ratio",
        "lh p50 ms",
        "etcd p50",
        "ratio",
        "lh p99 ms",
        "etcd p99",
        "ratio",
        "errors",
        "cpu ms/w (lh/etcd)",
        "load (lh/etcd)"
    );
    for (clients, lh, et) in &results {
        println!(
            "{:>7} | {:>12.0} {:>12.0} {:>6} | {:>9.2} {:>9.2} {:>6} | {:>9.2} {:>9.2} {:>6} | {:>3}/{:<3} | {:>8.3} / {:<7.3} | {} / {}",
            clients,
            lh.throughput(),
            et.throughput(),
            ratio(lh.throughput(), et.throughput()),
            lh.percentile_ms(0.5),
            et.percentile_ms(0.5),
            ratio(lh.percentile_ms(0.5), et.percentile_ms(0.5)),
            lh.percentile_ms(0.99),
            et.percentile_ms(0.99),
            ratio(lh.percentile_ms(0.99), et.percentile_ms(0.99)),
            lh.errors,
            et.errors,
            lh.cpu_ms_per_write,
            et.cpu_ms_per_write,
            lh.loadavg.split(' ').next().unwrap_or("?"),
            et.loadavg.split(' ').next().unwrap_or("?"),
        );
    }
    if settings.failovers > 0 {
        let show = |values: &mut Vec<Duration>| {
            let med = median(values).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
            let all: Vec<String> = values
                .iter()
                .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
                .collect();
            (med, all.join(" "))
        };
        let [lh, et] = &mut failovers;
        let (lh_median, lh_all) = show(lh);
        let (et_median, et_all) = show(et);
        println!(
            "failover (SIGKILL leader -> first committed write), median of {}: longhaul {lh_median:.0} ms [{lh_all}], etcd {et_median:.0} ms [{et_all}], ratio {}",
            settings.failovers,
            ratio(lh_median, et_median)
        );
    }
    println!(
        "ratios are longhaul / etcd: above 1 is better for throughput, below 1 is better for latency and failover. load average at end {}",
        loadavg()
    );
    Ok(())
}

fn main() -> ExitCode {
    let settings = match settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Dropping `run` on timeout or error drops its clusters: every process is killed.
    let outcome = runtime.block_on(async { tokio::time::timeout(RUN_LIMIT, run(settings)).await });
    match outcome {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("error: the benchmark did not finish within {RUN_LIMIT:?}");
            ExitCode::FAILURE
        }
    }
}
