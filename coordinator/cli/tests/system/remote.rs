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
}
