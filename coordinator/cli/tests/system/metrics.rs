//! Prometheus metrics of running processes, checked as an operator's tools
//! check them: a rehearsal of the bundled quick-exchange scenario (a
//! replica, two agents playing outer rounds, the emulator) saves a scrape of
//! every process (`--metrics`), and a `longhaul emulate` process is scraped
//! over HTTP while it runs. Every scrape must pass `promtool check metrics`
//! without a warning (help text, types, units, naming), every `longhaul_`
//! name in them must be in one of the tables that describe them, and every
//! metric the Grafana dashboard (`deploy/grafana/longhaul.json`) queries
//! must be among the names exported.
//!
//! Without `promtool` (Debian's `prometheus` package) the test says why and
//! passes, unless `LONGHAUL_REQUIRE_PROMTOOL` is set (CI sets it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use longhaul_core::telemetry::Metric;
use longhaul_testkit::{KillOnDrop, free_addr};

use crate::rehearse::run_bounded;

const REQUIRE: &str = "LONGHAUL_REQUIRE_PROMTOOL";

fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

/// Whether promtool runs here; panics if it must and does not.
fn promtool_available() -> bool {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os(REQUIRE).is_none(),
            "{REQUIRE} is set but promtool does not run (apt-get install prometheus)"
        );
        eprintln!(
            "skipped: no promtool (apt-get install prometheus; {REQUIRE}=1 makes this a failure)"
        );
    }
    found
}

/// `promtool check metrics` on one scrape: its findings (empty when clean).
fn promtool_findings(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, text.as_bytes()).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() && findings.trim().is_empty() {
        return format!("promtool exited with {}", output.status);
    }
    findings.trim().to_string()
}

/// The metric names of samples in a scrape.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Every name the tables let a process expose.
fn described() -> BTreeSet<String> {
    let tables: [&[Metric]; 3] = [
        longhaul_coordinator::metrics::TABLE,
        longhaul_site_agent::metrics::TABLE,
        longhaul_simulations::emulator::metrics::TABLE,
    ];
    tables
        .iter()
        .flat_map(|table| table.iter())
        .flat_map(Metric::exposed_names)
        .collect()
}

/// The `longhaul_` metric names in the dashboard's queries.
fn dashboard_metrics(dashboard: &serde_json::Value) -> BTreeSet<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "query", serde_json::Value::String(expr)) => {
                            out.push(expr.clone());
                        }
                        _ => walk(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    walk(dashboard, &mut exprs);
    let mut names = BTreeSet::new();
    for expr in exprs {
        let bytes = expr.as_bytes();
        let mut at = 0;
        while let Some(offset) = expr[at..].find("longhaul_") {
            let start = at + offset;
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            names.insert(expr[start..end].to_string());
            at = end;
        }
    }
    names
}

/// One GET of `/metrics`, or `None` if nothing answers yet.
fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.")
        .then_some(())
        .filter(|()| head.lines().next().is_some_and(|l| l.contains(" 200")))?;
    Some(body.to_string())
}

#[test]
fn every_process_exports_described_metrics_that_pass_promtool_and_feed_the_dashboard() {
    if !promtool_available() {
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("metrics");
    let (output, _) = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_longhaul"))
            .args(["rehearse"])
            .arg(repo_file("deploy/scenarios/quick-exchange.toml"))
            .arg("--metrics")
            .arg(&saved),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    let mut scrapes: Vec<(String, String)> = Vec::new();
    for name in ["replica-1", "agent-north", "agent-south", "emulator"] {
        let path = saved.join(format!("{name}.prom"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{stderr}", path.display()));
        scrapes.push((name.to_string(), text));
    }

    // A standalone emulator, scraped over HTTP while it runs.
    let metrics = free_addr();
    let mut command = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    command
        .arg("emulate")
        .arg(repo_file("deploy/scenarios/two-campuses-80km.toml"))
        .args(["--control", &free_addr().to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(["--duration", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let emulate = KillOnDrop::spawn("longhaul emulate", &mut command).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        match scrape(metrics) {
            Some(text) if text.contains("longhaul_emulator_lateness_seconds") => break text,
            _ if Instant::now() > deadline => {
                panic!("longhaul emulate served no link metrics in 30 s")
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    drop(emulate);
    scrapes.push(("longhaul emulate".into(), text));

    let described = described();
    let mut exported = BTreeSet::new();
    let mut problems = Vec::new();
    for (name, text) in &scrapes {
        let findings = promtool_findings(text);
        println!(
            "promtool check metrics < {name}: {} lines, {}",
            text.lines().count(),
            if findings.is_empty() {
                "clean"
            } else {
                &findings
            }
        );
        if !findings.is_empty() {
            problems.push(format!("{name}: promtool: {findings}"));
        }
        for metric in sample_names(text) {
            if metric.starts_with("longhaul_") && !described.contains(&metric) {
                problems.push(format!("{name}: {metric} is in no table"));
            }
            exported.insert(metric);
        }
    }
    // Each kind of process shows its own families.
    for (prefix, from) in [
        ("longhaul_raft_term", "replica-1"),
        ("longhaul_agent_probes_total", "agent-north"),
        ("longhaul_agent_exchange_bytes_total", "agent-north"),
        ("longhaul_emulator_delivered_bytes_total", "emulator"),
    ] {
        let text = &scrapes.iter().find(|(n, _)| n == from).unwrap().1;
        if !sample_names(text).contains(prefix) {
            problems.push(format!("{from} exports no {prefix}"));
        }
    }
    // Start-up figures reach the exporter: the rehearsal's agents run
    // without mTLS, and say so.
    let north = &scrapes.iter().find(|(n, _)| n == "agent-north").unwrap().1;
    if !north.lines().any(|l| l == "longhaul_agent_tls_insecure 1") {
        problems.push("agent-north does not report longhaul_agent_tls_insecure 1".into());
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/longhaul.json")).unwrap(),
    )
    .unwrap();
    let queried = dashboard_metrics(&dashboard);
    assert!(
        queried.len() >= 20,
        "the dashboard queries only {queried:?}"
    );
    for metric in &queried {
        if !exported.contains(metric) {
            problems.push(format!(
                "the dashboard queries {metric}, which no process exported"
            ));
        }
    }
    println!("the dashboard's {} metrics are all exported", queried.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
