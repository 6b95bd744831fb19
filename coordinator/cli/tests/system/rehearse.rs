//! `longhaul rehearse` end to end: the bundled quick-failover scenario
//! (three replica processes, two agent processes, emulated links between
//! the campuses) kills the leader, partitions the south campus and heals
//! it; the report must show each consequence.

use std::process::Command;

use serde_json::Value;

#[test]
fn a_rehearsal_reports_the_new_leader_the_partitioned_site_and_the_re_plan() {
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/scenarios/quick-failover.toml"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["rehearse", scenario, "--output", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let timeline = report["timeline"].as_array().unwrap();
    let after = |what: &str| -> Vec<&Value> {
        timeline
            .iter()
            .filter(|r| r["after"].as_str().is_some_and(|a| a.starts_with(what)))
            .collect()
    };
    let ttl = report["lease_ttl_ms"].as_u64().unwrap();

    // A new leader, within a few election timeouts of the kill. (On a starved
    // machine a survivor may miss heartbeats and call one more election before
    // the restart; the first new leader is what the rehearsal must report.)
    let leaders: Vec<&Value> = after("kill-leader")
        .into_iter()
        .filter(|r| r["kind"] == "leader")
        .collect();
    assert!(
        !leaders.is_empty(),
        "a leader change after the kill: {timeline:#?}"
    );
    assert!(
        leaders[0]["took_ms"].as_u64().unwrap() < 10_000,
        "{:?}",
        leaders[0]
    );

    // South down after the partition: within the lease TTL, or, when the
    // leader itself was in the south, an election and then the new
    // leader's grace (at most a TTL from when it took over). Up again once
    // healed.
    let down: Vec<&Value> = after("partition south")
        .into_iter()
        .filter(|r| r["kind"] == "site")
        .collect();
    assert_eq!(down.len(), 1, "{timeline:#?}");
    assert_eq!(down[0]["up"], Value::Bool(false));
    assert!(
        down[0]["took_ms"].as_u64().unwrap() <= 2 * ttl + 5_000,
        "{:?}",
        down[0]
    );
    let up: Vec<&Value> = after("heal south")
        .into_iter()
        .filter(|r| r["kind"] == "site")
        .collect();
    assert_eq!(up.len(), 1, "{timeline:#?}");
    assert_eq!(up[0]["up"], Value::Bool(true));

    // The job that used both campuses moves off south when it goes down.
    assert_eq!(
        report["plan"]["sites"],
        serde_json::json!(["north", "south"])
    );
    let replans = after("site south down");
    assert!(
        !replans.is_empty(),
        "no re-plan after south went down: {timeline:#?}"
    );
    assert!(
        !replans[0]["job_sites"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "south"),
        "{:?}",
        replans[0]
    );

    // Traffic crossed the emulated links, and the cut dropped some of it.
    let links = report["links"].as_array().unwrap();
    assert_eq!(links.len(), 2);
    for link in links {
        assert!(link["bytes_delivered"].as_u64().unwrap() > 0, "{link}");
    }
    assert!(
        links.iter().any(|l| l["drops_down"].as_u64().unwrap() > 0),
        "the partition dropped nothing: {links:?}"
    );
    // Progress went to stderr while it ran.
    assert!(stderr.contains("partitioned south"), "{stderr}");
}
