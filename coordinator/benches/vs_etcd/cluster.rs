//! Three-member clusters of either system on loopback, each member a real
//! process with its own temp data dir, and a uniform write client.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tempfile::TempDir;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::etcd_api::{EtcdClient, PutRequest, StatusRequest};
use crate::metrics::{Samples, scrape};
use crate::procs::{Proc, free_port, spawn};

/// The election timing both systems get: a 100 ms heartbeat and a 1 s
/// election timeout (both randomise the actual timeout in [1 s, 2 s)).
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_MS: u64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    Longhaul,
    Etcd,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            Self::Longhaul => "longhaul",
            Self::Etcd => "etcd",
        }
    }
}

/// What each write carries; built once, cloned per request.
#[derive(Debug, Clone)]
pub struct Payload {
    /// The job spec submitted to longhaul (its name is replaced per write).
    pub job: pb::JobSpec,
    /// The etcd value; key + value bytes equal longhaul's command bytes.
    pub etcd_value: Vec<u8>,
}

/// Where to find the binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub coordinator: PathBuf,
    pub etcd: PathBuf,
}

/// A running three-member cluster. Fields drop in order: the processes are
/// killed before their data dirs are removed.
#[derive(Debug)]
pub struct Cluster {
    pub system: System,
    members: Vec<Proc>,
    client_urls: Vec<String>,
    /// `host:port` serving each member's Prometheus `/metrics`.
    metrics: Vec<String>,
    dir: TempDir,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn endpoint(url: &str) -> Result<Endpoint, BoxError> {
    Ok(Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true))
}

impl Cluster {
    pub fn start(system: System, bins: &Binaries) -> Result<Self, BoxError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("vs-etcd-{}-", system.name()))
            .tempdir()?;
        match system {
            System::Longhaul => Self::start_longhaul(dir, &bins.coordinator),
            System::Etcd => Self::start_etcd(dir, &bins.etcd),
        }
    }

    fn start_longhaul(dir: TempDir, bin: &Path) -> Result<Self, BoxError> {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect();
        let initial: Vec<String> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| format!("{}={url}", i + 1))
            .collect();
        let metrics: Vec<String> = (0..3)
            .map(|_| free_port().map(|p| format!("127.0.0.1:{p}")))
            .collect::<Result<_, _>>()?;
        let mut members = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let id = i + 1;
            let mut command = Command::new(bin);
            command
                .arg("--id")
                .arg(id.to_string())
                .arg("--data-dir")
                .arg(dir.path().join(format!("replica-{id}")))
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--initial-cluster")
                .arg(initial.join(","))
                .arg("--tick-interval")
                .arg(format!("{HEARTBEAT_MS}ms"))
                .arg("--heartbeat-ticks")
                .arg("1")
                .arg("--election-ticks")
                .arg((ELECTION_MS / HEARTBEAT_MS).to_string())
                .arg("--metrics-listen")
                .arg(&metrics[i])
                .arg("--log")
                .arg("warn");
            let log = dir.path().join(format!("replica-{id}.log"));
            members.push(spawn(&format!("coordinator {id}"), &mut command, &log)?);
        }
        Ok(Self {
            system: System::Longhaul,
            members,
            client_urls: urls,
            metrics,
            dir,
        })
    }

    fn start_etcd(dir: TempDir, bin: &Path) -> Result<Self, BoxError> {
        let mut client_ports = Vec::new();
        let mut peer_ports = Vec::new();
        for _ in 0..3 {
            client_ports.push(free_port()?);
            peer_ports.push(free_port()?);
        }
        let initial: Vec<String> = peer_ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{}=http://127.0.0.1:{p}", i + 1))
            .collect();
        let token = format!(
            "vs-etcd-{}",
            dir.path().file_name().map_or_else(
                || std::process::id().to_string(),
                |n| n.to_string_lossy().into_owned()
            )
        );
        let mut members = Vec::new();
        for i in 0..3 {
            let client = format!("http://127.0.0.1:{}", client_ports[i]);
            let peer = format!("http://127.0.0.1:{}", peer_ports[i]);
            let mut command = Command::new(bin);
            command
                .arg("--name")
                .arg(format!("m{}", i + 1))
                .arg("--data-dir")
                .arg(dir.path().join(format!("etcd-{}", i + 1)))
                .arg("--listen-client-urls")
                .arg(&client)
                .arg("--advertise-client-urls")
                .arg(&client)
                .arg("--listen-peer-urls")
                .arg(&peer)
                .arg("--initial-advertise-peer-urls")
                .arg(&peer)
                .arg("--initial-cluster")
                .arg(initial.join(","))
                .arg("--initial-cluster-token")
                .arg(&token)
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--heartbeat-interval")
                .arg(HEARTBEAT_MS.to_string())
                .arg("--election-timeout")
                .arg(ELECTION_MS.to_string())
                // longhaul's raft runs with pre-vote (and check-quorum): same here.
                .arg("--pre-vote=true")
                .arg("--logger")
                .arg("zap")
                .arg("--log-outputs")
                .arg("stderr")
                .arg("--log-level")
                .arg("warn");
            let log = dir.path().join(format!("etcd-{}.log", i + 1));
            members.push(spawn(&format!("etcd m{}", i + 1), &mut command, &log)?);
        }
        Ok(Self {
            system: System::Etcd,
            members,
            client_urls: client_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            // etcd serves /metrics on its client URLs.
            metrics: client_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect(),
            dir,
        })
    }

    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Any member that died on its own, as an error.
    pub fn check_alive(&mut self) -> Result<(), BoxError> {
        for member in &mut self.members {
            if let Some(exit) = member.exited() {
                return Err(format!("{exit} (logs in {})", self.dir.path().display()).into());
            }
        }
        Ok(())
    }

    /// CPU seconds (user + system) all members have used so far, from `/proc/<pid>/stat`
    /// (0 for a member that is gone). Less at the mercy of other load on the machine than
    /// throughput: what a write costs, not how soon it was scheduled.
    pub fn cpu_seconds(&self) -> f64 {
        // Clock ticks per second: 100 on every Linux this runs on (`getconf CLK_TCK`).
        const TICKS: f64 = 100.0;
        let ticks = |pid: u32| -> Option<u64> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name, in parentheses, may hold spaces: fields count after it.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        };
        self.members
            .iter()
            .filter_map(|member| member.id().and_then(ticks))
            .sum::<u64>() as f64
            / TICKS
    }

    /// Every member's metrics (empty for a member that does not answer).
    pub async fn scrape(&self) -> Vec<Samples> {
        let mut all = Vec::new();
        for address in &self.metrics {
            all.push(scrape(address).await.unwrap_or_default());
        }
        all
    }

    /// SIGKILLs member `index`.
    pub fn kill(&mut self, index: usize) {
        if let Some(member) = self.members.get_mut(index) {
            member.kill();
        }
    }

    /// A connected write client of member `index`.
    pub async fn writer(&self, index: usize, payload: &Payload) -> Result<Writer, BoxError> {
        let channel = endpoint(&self.client_urls[index])?.connect().await?;
        Ok(match self.system {
            System::Longhaul => Writer::Longhaul {
                client: CoordinatorClient::new(channel),
                job: Box::new(payload.job.clone()),
            },
            System::Etcd => Writer::Etcd {
                client: EtcdClient::new(channel),
                value: payload.etcd_value.clone(),
            },
        })
    }

    /// The leader's member index, if every member answers and all agree on
    /// the same leader.
    async fn agreed_leader(&self) -> Option<usize> {
        let mut leaders = Vec::new();
        let mut ids = Vec::new();
        for url in &self.client_urls {
            let channel = endpoint(url).ok()?.connect().await.ok()?;
            match self.system {
                System::Longhaul => {
                    let mut request =
                        tonic::Request::new(pb::GetClusterRequest { allow_stale: true });
                    request.set_timeout(Duration::from_millis(500));
                    let response = CoordinatorClient::new(channel)
                        .get_cluster(request)
                        .await
                        .ok()?
                        .into_inner();
                    leaders.push(response.leader_id);
                    ids.push(response.header?.member_id);
                }
                System::Etcd => {
                    let mut request = tonic::Request::new(StatusRequest {});
                    request.set_timeout(Duration::from_millis(500));
                    let status = EtcdClient::new(channel).status(request).await.ok()?;
                    leaders.push(status.leader);
                    ids.push(status.header?.member_id);
                }
            }
        }
        let first = *leaders.first()?;
        if first == 0 || leaders.iter().any(|l| *l != first) {
            return None;
        }
        ids.iter().position(|id| *id == first)
    }

    /// Waits (bounded) until all members agree on a leader and a write
    /// through it succeeds; returns the leader's index.
    pub async fn wait_ready(
        &mut self,
        payload: &Payload,
        limit: Duration,
    ) -> Result<usize, BoxError> {
        let deadline = Instant::now() + limit;
        let mut attempt = 0u64;
        loop {
            self.check_alive()?;
            if let Some(leader) = self.agreed_leader().await
                && let Ok(mut writer) = self.writer(leader, payload).await
                && writer
                    .write(&format!("ready-{attempt:06}"), Duration::from_secs(2))
                    .await
                    .is_ok()
            {
                return Ok(leader);
            }
            attempt += 1;
            if Instant::now() > deadline {
                return Err(format!(
                    "{} cluster not ready within {limit:?} (logs in {})",
                    self.system.name(),
                    self.dir.path().display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The current leader as agreed by all running members (bounded wait).
    pub async fn leader(&self, limit: Duration) -> Result<usize, BoxError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(leader) = self.agreed_leader().await {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                return Err(format!("{}: no agreed leader", self.system.name()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One client's connection, writing one command per call.
#[derive(Debug, Clone)]
pub enum Writer {
    Longhaul {
        client: CoordinatorClient<Channel>,
        job: Box<pb::JobSpec>,
    },
    Etcd {
        client: EtcdClient,
        value: Vec<u8>,
    },
}

impl Writer {
    /// Writes one command named `name` (unique per cluster); returns once it
    /// is committed and applied (longhaul) or committed (etcd Put).
    pub async fn write(&mut self, name: &str, timeout: Duration) -> Result<(), Status> {
        match self {
            Self::Longhaul { client, job } => {
                let mut spec = pb::JobSpec::clone(job);
                spec.name = name.to_string();
                let mut request = tonic::Request::new(pb::SubmitJobRequest {
                    spec: Some(spec),
                    expected_revision: 0,
                });
                request.set_timeout(timeout);
                client.submit_job(request).await.map(|_| ())
            }
            Self::Etcd { client, value } => {
                let mut request = tonic::Request::new(PutRequest {
                    key: etcd_key(name).into_bytes(),
                    value: value.clone(),
                });
                request.set_timeout(timeout);
                client.put(request).await.map(|_| ())
            }
        }
    }
}

/// The etcd key of write `name`.
pub fn etcd_key(name: &str) -> String {
    format!("bench/{name}")
}
