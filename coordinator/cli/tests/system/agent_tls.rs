//! An agent process configured with `[tls]` against a replica serving
//! mutual TLS, with certificates made here: it registers its site; an agent
//! configured for another site than its certificate names refuses to start,
//! and says why. (The coordinator's side of the rule — a certificate for
//! one site cannot register, renew or report another — is tested beside the
//! replica, in `coordinator/tests/cluster/tls.rs`.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use longhaul_coordinator::server::Replica;
use longhaul_core::identity::site_dns_name;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_site_agent::config::{AgentConfig, TlsFiles};
use longhaul_site_agent::inventory::InventoryConfig;
use longhaul_testkit::{KillOnDrop, TestCa, eventually, free_addr, replica_configs};

pub(crate) fn agent_config(
    dir: &Path,
    site: &str,
    cert: &str,
    coordinator: &str,
) -> std::path::PathBuf {
    let topology =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/two-campuses-80km.toml");
    // The TLS files are relative, so the agent finds them beside its config.
    let config = AgentConfig {
        tls: Some(TlsFiles {
            ca: "ca.pem".into(),
            cert: format!("{cert}.pem").into(),
            key: format!("{cert}.key").into(),
        }),
        state_dir: Some(dir.join(format!("state-{site}"))),
        ..AgentConfig::new(
            site,
            vec![format!("https://{coordinator}")],
            free_addr(),
            free_addr(),
            InventoryConfig::static_file(site, topology),
        )
    };
    let text = config.to_toml().unwrap();
    let path = dir.join(format!("{site}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_its_site_certificate_registers_over_mutual_tls() {
    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let pki = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let mut config = replica_configs(dir.path(), 1).remove(0);
    let replica_tls = pki.replica();
    config.tls = Some(replica_tls.clone());
    config.initial_cluster = [(1, format!("https://{}", config.listen))].into();
    let coordinator = config.listen.to_string();
    let replica = Replica::start(config).await.unwrap();
    pki.write(dir.path(), "north", &[&site_dns_name("north")]);

    // The north agent, with north's certificate: registered.
    let north = agent_config(dir.path(), "north", "north", &coordinator);
    let agent = KillOnDrop::spawn(
        "agent north",
        Command::new(env!("CARGO_BIN_EXE_longhaul"))
            .args(["internal", "agent", "--config"])
            .arg(&north)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{coordinator}"))
        .unwrap()
        .tls_config(replica_tls.client())
        .unwrap()
        .connect_lazy();
    let mut c = CoordinatorClient::new(channel);
    eventually(
        Duration::from_secs(60),
        "north registered over mTLS",
        || {
            let mut c = c.clone();
            async move {
                let sites = c
                    .list_sites(pb::ListSitesRequest { allow_stale: false })
                    .await
                    .ok()?
                    .into_inner()
                    .sites;
                sites
                    .iter()
                    .any(|s| {
                        s.site.as_ref().is_some_and(|x| x.id == "north")
                            && s.state() == pb::SiteState::Up
                    })
                    .then_some(())
            }
        },
    )
    .await;
    drop(agent);

    // An agent for south holding north's certificate refuses to start.
    let south = agent_config(dir.path(), "south", "north", &coordinator);
    let output = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["internal", "agent", "--config"])
        .arg(&south)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("does not name site \"south\"") && stderr.contains(&site_dns_name("south")),
        "{stderr}"
    );
    let sites = c
        .list_sites(pb::ListSitesRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner()
        .sites;
    assert!(
        sites
            .iter()
            .all(|s| s.site.as_ref().is_some_and(|x| x.id != "south"))
    );
    replica.stop().await;
}
