//! The operator CLI against an in-process replica over real gRPC.

use longhaul_coordinator::server::Replica;
use longhaul_testkit::{leader_of, replica_configs};

/// Runs the `longhaul` CLI (which has its own runtime) off the test's runtime.
async fn longhaul(args: Vec<String>) -> (u8, String, String) {
    tokio::task::spawn_blocking(move || {
        use clap::Parser;
        let cli =
            longhaul_cli::Cli::try_parse_from(std::iter::once("longhaul".to_string()).chain(args))
                .unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = longhaul_cli::run(cli, &mut out, &mut err);
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_queries_and_writes_through_any_endpoint() {
    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let config = replica_configs(dir.path(), 1).remove(0);
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    // The first endpoint is down; the CLI moves on to the next.
    let endpoints = format!("http://127.0.0.1:1,http://{}", config.listen);
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/examples/llama-70b.job.toml"
    )
    .to_string();
    let args = |rest: &[&str]| -> Vec<String> {
        rest.iter()
            .map(|s| s.to_string())
            .chain(["--endpoints".to_string(), endpoints.clone()])
            .collect()
    };
    let (status, out, err) = longhaul(args(&["jobs", "submit", &job])).await;
    assert_eq!(status, 0, "{err}");
    assert_eq!(out, "submitted job \"llama-70b\" at revision 1\n");
    let (status, out, _) = longhaul(args(&["jobs", "list"])).await;
    assert_eq!(status, 0);
    assert!(out.contains("llama-70b  infeasible"), "{out}");
    let (status, _, err) = longhaul(args(&[
        "jobs",
        "cancel",
        "llama-70b",
        "--expected-revision",
        "7",
    ]))
    .await;
    assert_eq!(status, 1);
    assert!(
        err.contains("FailedPrecondition: field `expected_revision`: stale revision"),
        "{err}"
    );
    let (status, out, _) = longhaul(args(&["cluster", "status"])).await;
    assert_eq!(status, 0);
    assert!(out.starts_with("leader 1  term"), "{out}");

    // With sites registered, a DiLoCo job has a schedule to show: the one
    // `sync plan` predicts from the same files.
    use longhaul_core::state::{Command, Request};
    let topology_file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/examples/two-campuses-500km.toml"
    );
    let topology = longhaul_core::Topology::from_toml(
        "t.toml",
        &std::fs::read_to_string(topology_file).unwrap(),
    )
    .unwrap();
    let raft = &replicas[0].as_ref().unwrap().raft;
    for site in &topology.sites {
        raft.propose(Request::new(Command::RegisterSite {
            site: site.clone(),
            data_address: String::new(),
            at_unix_ms: 0,
            lease_id: 0,
            lease_ttl_ms: 0,
        }))
        .await
        .unwrap();
    }
    raft.propose(Request::new(Command::PutLink {
        link: topology.links[0].clone(),
    }))
    .await
    .unwrap();
    let diloco_job = dir.path().join("diloco.job.toml");
    std::fs::write(
        &diloco_job,
        std::fs::read_to_string(&job)
            .unwrap()
            .replace("name = \"llama-70b\"", "name = \"llama-70b-diloco\"")
            .replace(
                "max_tensor_parallel = 8",
                "max_tensor_parallel = 8\ncross_site_mode = \"diloco\"",
            ),
    )
    .unwrap();
    let diloco_job = diloco_job.display().to_string();
    let (status, _, err) = longhaul(args(&["jobs", "submit", &diloco_job])).await;
    assert_eq!(status, 0, "{err}");
    let (status, out, err) = longhaul(args(&["sync", "show", "llama-70b-diloco"])).await;
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("sync schedule of job \"llama-70b-diloco\" at revision"),
        "{out}"
    );
    assert!(out.contains("north – south"), "{out}");
    let (status, shown, err) = longhaul(args(&[
        "sync",
        "show",
        "llama-70b-diloco",
        "--output",
        "json",
    ]))
    .await;
    assert_eq!(status, 0, "{err}");
    let (status, planned, err) = longhaul(vec![
        "sync".into(),
        "plan".into(),
        "--topology".into(),
        topology_file.into(),
        "--job".into(),
        diloco_job.clone(),
        "--output".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(status, 0, "{err}");
    let shown: longhaul_core::sync::SyncPlan = serde_json::from_str(&shown).unwrap();
    let planned: longhaul_core::sync::SyncPlan = serde_json::from_str(&planned).unwrap();
    assert_eq!(shown, planned);
    let (status, _, err) = longhaul(args(&["sync", "show", "no-such-job"])).await;
    assert_eq!(status, 1);
    assert!(err.contains("NotFound") && err.contains("job_id"), "{err}");
}

/// `longhaul rounds list` against a replica whose DiLoCo job's rounds find
/// nobody reporting: each is aborted once every participant was excluded,
/// and the list shows who was and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_list_shows_a_jobs_rounds_and_their_exclusions() {
    use longhaul_coordinator::server::convert::{job_to_wire, link_to_wire, site_to_wire};
    use longhaul_proto::v1 as pb;

    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = replica_configs(dir.path(), 1).remove(0);
    config.round_timing.fixed = Some(std::time::Duration::from_secs(1));
    let replicas = [Some(Replica::start(config.clone()).await.unwrap())];
    leader_of(&replicas).await;
    let endpoint = format!("http://{}", config.listen);
    let topology = longhaul_core::Topology::from_toml(
        "three-continents.toml",
        include_str!("../../../tests/cluster/fixtures/three-continents.toml"),
    )
    .unwrap();
    let mut agents =
        longhaul_proto::v1::agent_service_client::AgentServiceClient::connect(endpoint.clone())
            .await
            .unwrap();
    for site in &topology.sites {
        agents
            .register(pb::RegisterRequest {
                site_id: site.id.clone(),
                inventory: Some(site_to_wire(site)),
                data_address: String::new(),
            })
            .await
            .unwrap();
    }
    let mut coordinator =
        longhaul_proto::v1::coordinator_client::CoordinatorClient::connect(endpoint.clone())
            .await
            .unwrap();
    for link in &topology.links {
        coordinator
            .put_link(pb::PutLinkRequest {
                link: Some(link_to_wire(link)),
                expected_revision: 0,
            })
            .await
            .unwrap();
    }
    let spec = longhaul_core::JobSpec::from_toml(
        "dense-400b.job.toml",
        include_str!("../../../../deploy/examples/dense-400b.job.toml"),
    )
    .map(|mut spec| {
        spec.constraints.allowed_sites = topology.sites.iter().map(|s| s.id.clone()).collect();
        spec
    })
    .unwrap();
    let mut request = tonic::Request::new(pb::SubmitJobRequest {
        spec: Some(job_to_wire(&spec)),
        expected_revision: 0,
    });
    request.set_timeout(std::time::Duration::from_secs(30));
    coordinator.submit_job(request).await.unwrap();
    longhaul_testkit::eventually(
        std::time::Duration::from_secs(30),
        "round 1 to be over",
        || async {
            let rounds = coordinator
                .clone()
                .list_rounds(pb::ListRoundsRequest {
                    job_id: "dense-400b".into(),
                    allow_stale: false,
                })
                .await
                .ok()?
                .into_inner()
                .rounds;
            rounds
                .first()
                .is_some_and(|r| r.state() == pb::RoundState::Aborted)
                .then_some(())
        },
    )
    .await;
    let args = |rest: &[&str]| -> Vec<String> {
        rest.iter()
            .map(|s| s.to_string())
            .chain(["--endpoints".to_string(), endpoint.clone()])
            .collect()
    };
    let (status, out, err) = longhaul(args(&["rounds", "list", "dense-400b"])).await;
    assert_eq!(status, 0, "{err}");
    assert!(
        out.contains("rounds of job \"dense-400b\" at revision"),
        "{out}"
    );
    assert!(
        out.contains("round 1: every participant was excluded"),
        "{out}"
    );
    let first = out
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(first.contains("aborted"), "{first}");
    assert!(first.contains("paris ("), "{first}");
    let (status, out, err) =
        longhaul(args(&["rounds", "list", "dense-400b", "--output", "json"])).await;
    assert_eq!(status, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let round = &listed["rounds"][0];
    assert_eq!(round["round"], 1);
    assert_eq!(round["state"], "aborted");
    // No trainer measured a step (the round ended before any report).
    assert!(round["measured_inner_step_ms"].is_null(), "{round}");
    assert!(round["deadline_unix_ms"].as_u64() > round["opened_at_unix_ms"].as_u64());
    assert_eq!(
        round["excluded"].as_array().map(Vec::len),
        Some(3),
        "{round}"
    );
    let (status, _, err) = longhaul(args(&["rounds", "list", "nope"])).await;
    assert_eq!(status, 1);
    assert!(err.contains("NotFound: field `job_id`"), "{err}");
}
