//! Commands that talk to a running coordinator over gRPC: `cluster`,
//! `sites`, `links`, `jobs` (and the helpers `rounds.rs` shares).
//!
//! `--endpoints` lists replicas; each command tries them in order until one
//! answers, so any replica, leader or not, will do (followers forward
//! writes). Every call has a deadline (`--timeout`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use longhaul_core::JobSpec;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use super::table::{Table, thousands};
use super::{Failure, Output, read};
use longhaul_coordinator::server::convert::job_to_wire;
use longhaul_coordinator::server::tls::TlsMaterial;

#[derive(Debug, Args)]
pub struct Remote {
    /// Coordinator replicas to try, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7700",
        env = "LONGHAUL_ENDPOINTS"
    )]
    pub endpoints: Vec<String>,
    /// Deadline of each call, e.g. `5s`.
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Serve reads from the replica's local state without a linearizable
    /// read barrier (works without a quorum; may be stale).
    #[arg(long)]
    pub stale: bool,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Mutual TLS: the CA certificate (PEM) of the cluster; with --cert and --key.
    #[arg(long, requires_all = ["cert", "key"], env = "LONGHAUL_TLS_CA")]
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM); an operator's names `operator.longhaul`.
    #[arg(long, requires = "ca", env = "LONGHAUL_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, requires = "ca", env = "LONGHAUL_TLS_KEY")]
    pub key: Option<PathBuf>,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let parsed: longhaul_core::units::Duration = text.parse().map_err(|e| format!("{e}"))?;
    Ok(parsed.into())
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, members, applied index and revision.
    Status(Remote),
    /// Add a replica (start it afterwards with `coordinator --join`).
    AddMember {
        #[command(flatten)]
        remote: Remote,
        /// The new replica's URL, e.g. http://10.0.0.4:7700.
        #[arg(long)]
        peer_url: String,
        #[arg(long, default_value = "")]
        name: String,
        /// Add as a non-voting learner.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a replica (the leader too: it hands over first).
    RemoveMember {
        #[command(flatten)]
        remote: Remote,
        /// The replica's id.
        id: u64,
    },
    /// Move leadership to another voter.
    TransferLeader {
        #[command(flatten)]
        remote: Remote,
        /// The voter to lead.
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum SitesCommand {
    /// Registered sites, their liveness and GPU counts.
    List(Remote),
}

#[derive(Debug, Subcommand)]
pub enum LinksCommand {
    /// Configured WAN links and the agents' latest measurements.
    List(Remote),
    /// Configure every link of a topology file between registered sites
    /// (links to sites not registered yet are skipped and listed).
    Put {
        #[command(flatten)]
        remote: Remote,
        /// The topology file (TOML) whose `[[links]]` to configure.
        #[arg(long)]
        topology: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Stored jobs and their states.
    List(Remote),
    /// Submit a job file.
    Submit {
        #[command(flatten)]
        remote: Remote,
        /// The job file (TOML).
        file: PathBuf,
        /// Apply only if the store is at this revision (compare-and-set).
        #[arg(long)]
        expected_revision: Option<u64>,
    },
    /// Cancel a job.
    Cancel {
        #[command(flatten)]
        remote: Remote,
        id: String,
        #[arg(long)]
        expected_revision: Option<u64>,
    },
}

/// Runs `f` against each endpoint until one answers with something other
/// than UNAVAILABLE; returns the first answer.
pub(crate) async fn call<T, F, Fut>(remote: &Remote, mut f: F) -> Result<T, Failure>
where
    F: FnMut(CoordinatorClient<Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let tls = match (&remote.ca, &remote.cert, &remote.key) {
        (Some(ca), Some(cert), Some(key)) => Some(
            TlsMaterial::from_files(ca, cert, key)
                .map_err(anyhow::Error::from)?
                .client(),
        ),
        _ => None,
    };
    let mut last = None;
    for endpoint in &remote.endpoints {
        let mut channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .map_err(|e| anyhow!("endpoint {endpoint:?} is not a URL: {e}"))?;
        if let Some(tls) = &tls {
            channel = channel
                .tls_config(tls.clone())
                .map_err(|e| anyhow!("endpoint {endpoint:?}: TLS: {e}"))?;
        }
        let channel = channel
            .connect_timeout(remote.timeout.min(Duration::from_secs(2)))
            .timeout(remote.timeout)
            .connect_lazy();
        match f(CoordinatorClient::new(channel)).await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                last = Some(format!("{endpoint}: {}", status.message()));
            }
            Err(status) => {
                return Err(
                    anyhow!("{endpoint}: {:?}: {}", status.code(), status.message()).into(),
                );
            }
        }
    }
    Err(anyhow!(
        "no endpoint answered ({})",
        last.unwrap_or_else(|| "no endpoints given".to_string())
    )
    .into())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(Failure::from)
}

pub(crate) fn json(value: &impl serde::Serialize, out: &mut dyn Write) -> Result<(), Failure> {
    super::print_json(value, out)
}

pub fn cluster(command: ClusterCommand, out: &mut dyn Write) -> Result<(), Failure> {
    runtime()?.block_on(async {
        match command {
            ClusterCommand::Status(remote) => {
                let allow_stale = remote.stale;
                let status = call(&remote, |mut c| async move {
                    c.get_cluster(pb::GetClusterRequest { allow_stale }).await
                })
                .await?;
                let header = status.header.unwrap_or_default();
                if remote.output == Output::Json {
                    return json(&serde_json::json!({
                        "leader_id": status.leader_id,
                        "term": header.raft_term,
                        "revision": header.revision,
                        "applied_index": status.applied_index,
                        "commit_index": status.commit_index,
                        "answered_by": header.member_id,
                        "members": status.members.iter().map(|m| serde_json::json!({
                            "id": m.id, "name": m.name, "peer_url": m.peer_url, "learner": m.is_learner,
                        })).collect::<Vec<_>>(),
                    }), out);
                }
                writeln!(
                    out,
                    "leader {}  term {}  revision {}  applied {}  commit {}  (answered by replica {})",
                    if status.leader_id == 0 { "none".to_string() } else { status.leader_id.to_string() },
                    header.raft_term,
                    header.revision,
                    status.applied_index,
                    status.commit_index,
                    header.member_id
                )?;
                let mut table = Table::new(&[("id", true), ("name", false), ("role", false), ("peer url", false)]);
                for m in &status.members {
                    let role = if m.id == status.leader_id {
                        "leader"
                    } else if m.is_learner {
                        "learner"
                    } else {
                        "voter"
                    };
                    table.row(vec![m.id.to_string(), m.name.clone(), role.into(), m.peer_url.clone()]);
                }
                write!(out, "{}", table.render(0))?;
                Ok(())
            }
            ClusterCommand::AddMember { remote, peer_url, name, learner } => {
                let response = call(&remote, |mut c| {
                    let request = pb::AddMemberRequest {
                        name: name.clone(),
                        peer_url: peer_url.clone(),
                        client_url: peer_url.clone(),
                        as_learner: learner,
                    };
                    async move { c.add_member(request).await }
                })
                .await?;
                let id = response.member.map_or(0, |m| m.id);
                writeln!(out, "added replica {id} ({peer_url}); start it with: coordinator --join --id {id} ...")?;
                Ok(())
            }
            ClusterCommand::RemoveMember { remote, id } => {
                call(&remote, |mut c| async move { c.remove_member(pb::RemoveMemberRequest { id }).await }).await?;
                writeln!(out, "removed replica {id}")?;
                Ok(())
            }
            ClusterCommand::TransferLeader { remote, id } => {
                call(&remote, |mut c| async move {
                    c.transfer_leader(pb::TransferLeaderRequest { target_id: id }).await
                })
                .await?;
                writeln!(out, "replica {id} leads")?;
                Ok(())
            }
        }
    })
}

pub fn sites(command: SitesCommand, out: &mut dyn Write) -> Result<(), Failure> {
    let SitesCommand::List(remote) = command;
    runtime()?.block_on(async {
        let allow_stale = remote.stale;
        let response = call(&remote, |mut c| async move { c.list_sites(pb::ListSitesRequest { allow_stale }).await }).await?;
        let revision = response.header.unwrap_or_default().revision;
        if remote.output == Output::Json {
            let sites: Vec<_> = response
                .sites
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "id": s.site.as_ref().map(|x| x.id.clone()).unwrap_or_default(),
                        "state": pb::SiteState::try_from(s.state).map(|x| x.as_str_name()).unwrap_or("UNKNOWN"),
                        "state_revision": s.state_revision,
                        "state_reason": s.state_reason,
                        "gpus": s.gpus,
                        "data_address": s.data_address,
                        "lease_ttl_ms": s.lease_ttl_ms,
                    })
                })
                .collect();
            return json(&serde_json::json!({ "revision": revision, "sites": sites }), out);
        }
        writeln!(out, "{} sites at revision {revision}", response.sites.len())?;
        let mut table = Table::new(&[("site", false), ("state", false), ("since revision", true), ("GPUs", true), ("agent", false), ("reason", false)]);
        for s in &response.sites {
            let state = match pb::SiteState::try_from(s.state) {
                Ok(pb::SiteState::Up) => "up",
                Ok(pb::SiteState::Down) => "down",
                _ => "unknown",
            };
            table.row(vec![
                s.site.as_ref().map(|x| x.id.clone()).unwrap_or_default(),
                state.into(),
                s.state_revision.to_string(),
                thousands(s.gpus),
                if s.data_address.is_empty() { "-".into() } else { s.data_address.clone() },
                s.state_reason.clone(),
            ]);
        }
        write!(out, "{}", table.render(0))?;
        Ok(())
    })
}

pub fn links(command: LinksCommand, out: &mut dyn Write) -> Result<(), Failure> {
    runtime()?.block_on(async {
        match command {
            LinksCommand::List(remote) => {
                let allow_stale = remote.stale;
                let response = call(&remote, |mut c| async move {
                    c.list_links(pb::ListLinksRequest { allow_stale }).await
                })
                .await?;
                let revision = response.header.unwrap_or_default().revision;
                if remote.output == Output::Json {
                    let links: Vec<_> = response
                        .links
                        .iter()
                        .map(|l| {
                            let c = l.configured.clone().unwrap_or_default();
                            serde_json::json!({
                                "between": [c.site_a, c.site_b],
                                "distance_km": c.distance_km,
                                "parallel_links": c.parallel_links,
                                "link_bps": c.link_bps,
                                "measured": l.measured.map(|m| serde_json::json!({
                                    "rtt_ns": m.rtt_ns, "loss_rate": m.loss_rate,
                                    "throughput_bps": m.throughput_bps,
                                    "measured_at_unix_ms": m.measured_at_unix_ms,
                                })),
                            })
                        })
                        .collect();
                    return json(
                        &serde_json::json!({ "revision": revision, "links": links }),
                        out,
                    );
                }
                writeln!(out, "{} links at revision {revision}", response.links.len())?;
                let mut table = Table::new(&[
                    ("between", false),
                    ("km", true),
                    ("configured", true),
                    ("measured RTT", true),
                    ("loss", true),
                    ("throughput", true),
                ]);
                for l in &response.links {
                    let c = l.configured.clone().unwrap_or_default();
                    let rate = c.link_bps as f64 * f64::from(c.parallel_links.max(1)) / 1e9;
                    let (rtt, loss, tput) = match l.measured {
                        Some(m) => (
                            format!("{:.2} ms", m.rtt_ns as f64 / 1e6),
                            format!("{:.2}%", m.loss_rate * 100.0),
                            format!("{:.2} Gbit/s", m.throughput_bps as f64 / 1e9),
                        ),
                        None => ("-".into(), "-".into(), "-".into()),
                    };
                    table.row(vec![
                        format!("{} - {}", c.site_a, c.site_b),
                        format!("{:.0}", c.distance_km),
                        format!("{rate:.0} Gbit/s"),
                        rtt,
                        loss,
                        tput,
                    ]);
                }
                write!(out, "{}", table.render(0))?;
                Ok(())
            }
            LinksCommand::Put { remote, topology } => {
                let name = topology.display().to_string();
                let topology = longhaul_core::Topology::from_toml(&name, &read(&topology)?)?;
                let registered = call(&remote, |mut c| async move {
                    c.list_sites(pb::ListSitesRequest { allow_stale: false })
                        .await
                })
                .await?;
                let known: Vec<String> = registered
                    .sites
                    .iter()
                    .filter_map(|s| s.site.as_ref().map(|x| x.id.clone()))
                    .collect();
                for link in &topology.links {
                    let [a, b] = &link.between;
                    if !known.contains(a) || !known.contains(b) {
                        writeln!(out, "skipped {a} - {b}: not both sites are registered")?;
                        continue;
                    }
                    let wire = longhaul_coordinator::server::convert::link_to_wire(link);
                    let response = call(&remote, |mut c| {
                        let request = pb::PutLinkRequest {
                            link: Some(wire.clone()),
                            expected_revision: 0,
                        };
                        async move { c.put_link(request).await }
                    })
                    .await?;
                    writeln!(
                        out,
                        "configured {a} - {b} at revision {}",
                        response.header.unwrap_or_default().revision
                    )?;
                }
                Ok(())
            }
        }
    })
}

pub fn jobs(command: JobsCommand, out: &mut dyn Write) -> Result<(), Failure> {
    runtime()?.block_on(async {
        match command {
            JobsCommand::List(remote) => {
                let allow_stale = remote.stale;
                let response = call(&remote, |mut c| async move { c.list_jobs(pb::ListJobsRequest { allow_stale }).await }).await?;
                let revision = response.header.unwrap_or_default().revision;
                let state = |j: &pb::Job| match pb::JobState::try_from(j.state) {
                    Ok(pb::JobState::Placed) => "placed",
                    Ok(pb::JobState::Infeasible) => "infeasible",
                    Ok(pb::JobState::Cancelled) => "cancelled",
                    Ok(pb::JobState::Pending) => "pending",
                    _ => "unknown",
                };
                if remote.output == Output::Json {
                    let jobs: Vec<_> = response
                        .jobs
                        .iter()
                        .map(|j| serde_json::json!({ "id": j.id, "state": state(j), "revision": j.revision }))
                        .collect();
                    return json(&serde_json::json!({ "revision": revision, "jobs": jobs }), out);
                }
                writeln!(out, "{} jobs at revision {revision}", response.jobs.len())?;
                let mut table = Table::new(&[("job", false), ("state", false), ("revision", true)]);
                for j in &response.jobs {
                    table.row(vec![j.id.clone(), state(j).into(), j.revision.to_string()]);
                }
                write!(out, "{}", table.render(0))?;
                Ok(())
            }
            JobsCommand::Submit { remote, file, expected_revision } => {
                let name = file.display().to_string();
                let spec = JobSpec::from_toml(&name, &read(&file)?)?;
                let wire = job_to_wire(&spec);
                let response = call(&remote, |mut c| {
                    let request = pb::SubmitJobRequest {
                        spec: Some(wire.clone()),
                        expected_revision: expected_revision.unwrap_or(0),
                    };
                    async move { c.submit_job(request).await }
                })
                .await?;
                writeln!(
                    out,
                    "submitted job {:?} at revision {}",
                    spec.name,
                    response.header.unwrap_or_default().revision
                )?;
                Ok(())
            }
            JobsCommand::Cancel { remote, id, expected_revision } => {
                let response = call(&remote, |mut c| {
                    let request = pb::CancelJobRequest {
                        job_id: id.clone(),
                        expected_revision: expected_revision.unwrap_or(0),
                    };
                    async move { c.cancel_job(request).await }
                })
                .await?;
                writeln!(out, "cancelled job {id:?} at revision {}", response.header.unwrap_or_default().revision)?;
                Ok(())
            }
        }
    })
}
