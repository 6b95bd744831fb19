//! `longhaul certs` end to end: a CA and certificates made by the command,
//! files with safe permissions and never overwritten; then a replica serving
//! mutual TLS with its replica certificate, an agent registering its site
//! with its site certificate, an operator listing sites with the operator
//! certificate, and the site's certificate refused a membership change (the
//! names the command writes are the ones the authorization boundary reads).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use longhaul_coordinator::server::Replica;
use longhaul_coordinator::server::tls::TlsMaterial;
use longhaul_testkit::{KillOnDrop, eventually, replica_configs};

use crate::agent_tls::agent_config;

fn longhaul(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(args)
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_made_by_longhaul_certs_authorize_replica_agent_and_operator() {
    let _serial = crate::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let d = certs.to_str().unwrap();
    for args in [
        vec!["certs", "init", "--dir", d],
        vec!["certs", "issue", "replica", "r1", "--dir", d],
        vec!["certs", "issue", "operator", "admin", "--dir", d],
        vec!["certs", "issue", "site", "north", "--dir", d],
    ] {
        let output = longhaul(&args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert_eq!(mode(&certs), 0o700);
    for name in ["ca", "r1", "admin", "north"] {
        assert_eq!(
            mode(&certs.join(format!("{name}.key"))),
            0o600,
            "{name}.key"
        );
        assert_eq!(
            mode(&certs.join(format!("{name}.pem"))),
            0o644,
            "{name}.pem"
        );
    }

    // Nothing is overwritten, and bad input changes nothing.
    let ca_before = std::fs::read(certs.join("ca.pem")).unwrap();
    for (args, expected) in [
        (vec!["certs", "init", "--dir", d], "ca.pem exists"),
        (
            vec!["certs", "issue", "site", "north", "--dir", d],
            "north.pem exists",
        ),
        (
            vec!["certs", "issue", "site", "North", "--dir", d],
            "NAME: invalid id",
        ),
        (
            vec![
                "certs", "issue", "replica", "r9", "--dir", d, "--host", "a b",
            ],
            "--host",
        ),
        // A host must not smuggle in a role.
        (
            vec![
                "certs",
                "issue",
                "site",
                "south",
                "--dir",
                d,
                "--host",
                "replica.longhaul",
            ],
            "is a role, not a host",
        ),
        (
            vec![
                "certs",
                "issue",
                "site",
                "south",
                "--dir",
                d,
                "--host",
                "north.site.longhaul",
            ],
            "is a role, not a host",
        ),
    ] {
        let output = longhaul(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read(certs.join("ca.pem")).unwrap(), ca_before);
    for file in ["North.pem", "r9.key", "south.key", "south.pem"] {
        assert!(!certs.join(file).exists(), "{file} was written");
    }
    let missing = dir.path().join("nowhere");
    let output = longhaul(&[
        "certs",
        "issue",
        "operator",
        "x",
        "--dir",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("longhaul certs init"));

    // A replica with r1's certificate.
    let mut config = replica_configs(dir.path(), 1).remove(0);
    config.tls = Some(
        TlsMaterial::from_files(
            &certs.join("ca.pem"),
            &certs.join("r1.pem"),
            &certs.join("r1.key"),
        )
        .unwrap(),
    );
    config.initial_cluster = [(1, format!("https://{}", config.listen))].into();
    let coordinator = config.listen.to_string();
    let endpoint = format!("https://{coordinator}");
    let replica = Replica::start(config).await.unwrap();

    // North's agent, with north's certificate (the config beside the files).
    let agent_file = agent_config(&certs, "north", "north", &coordinator);
    let agent = KillOnDrop::spawn(
        "agent north",
        Command::new(env!("CARGO_BIN_EXE_longhaul"))
            .args(["internal", "agent", "--config"])
            .arg(&agent_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    let as_holder = |holder: &str| {
        vec![
            "--endpoints".to_string(),
            endpoint.clone(),
            "--ca".into(),
            format!("{d}/ca.pem"),
            "--cert".into(),
            format!("{d}/{holder}.pem"),
            "--key".into(),
            format!("{d}/{holder}.key"),
        ]
    };
    let operator = as_holder("admin");
    eventually(
        Duration::from_secs(60),
        "north up, listed by the operator",
        || {
            let mut args = vec![
                "sites".to_string(),
                "list".into(),
                "--output".into(),
                "json".into(),
            ];
            args.extend(operator.iter().cloned());
            async move {
                // Blocking: off the runtime the replica runs on.
                let output = tokio::task::spawn_blocking(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    longhaul(&args)
                })
                .await
                .ok()?;
                let text = String::from_utf8_lossy(&output.stdout);
                (output.status.success()
                    && text.contains("\"north\"")
                    && text.contains("SITE_STATE_UP"))
                .then_some(())
            }
        },
    )
    .await;
    let mut status = vec!["cluster", "status"];
    status.extend(operator.iter().map(String::as_str));
    let output = longhaul(&status);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("leader 1"));

    // North's certificate may read, not change the membership.
    let mut add = vec![
        "cluster",
        "add-member",
        "--peer-url",
        "https://127.0.0.1:7999",
    ];
    let north = as_holder("north");
    add.extend(north.iter().map(String::as_str));
    let output = longhaul(&add);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "north changed the membership");
    assert!(stderr.to_lowercase().contains("permission"), "{stderr}");
    drop(agent);
    replica.stop().await;
}

fn not_after(pem_path: &Path) -> time::OffsetDateTime {
    let text = std::fs::read(pem_path).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&text).unwrap();
    pem.parse_x509().unwrap().validity().not_after.to_datetime()
}

/// A certificate never outlives the CA that signs it (a verifier would
/// refuse the chain from the CA's expiry on), and an expired CA signs
/// nothing.
#[test]
fn issued_certificates_end_no_later_than_their_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let d = certs.to_str().unwrap();
    let output = longhaul(&["certs", "init", "--dir", d, "--days", "2"]);
    assert!(output.status.success(), "{output:?}");
    let output = longhaul(&["certs", "issue", "site", "north", "--dir", d]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("the CA's expiry"), "{stdout}");
    let ca_end = not_after(&certs.join("ca.pem"));
    assert_eq!(not_after(&certs.join("north.pem")), ca_end);
    // Shorter than the CA: as asked.
    let output = longhaul(&[
        "certs", "issue", "operator", "admin", "--dir", d, "--days", "1",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("valid 1 days"));
    assert!(not_after(&certs.join("admin.pem")) < ca_end);

    // An expired CA (made here: the command only makes current ones).
    let expired = dir.path().join("expired");
    std::fs::create_dir(&expired).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(10);
    params.not_after = now - time::Duration::days(1);
    let ca = params.self_signed(&key).unwrap();
    std::fs::write(expired.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(expired.join("ca.key"), key.serialize_pem()).unwrap();
    let output = longhaul(&[
        "certs",
        "issue",
        "site",
        "north",
        "--dir",
        expired.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("the CA expired"));
    assert!(!expired.join("north.pem").exists());
    assert!(!expired.join("north.key").exists());
}
