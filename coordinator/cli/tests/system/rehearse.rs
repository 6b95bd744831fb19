//! `longhaul rehearse` end to end: the bundled quick-failover scenario
//! (three replica processes, two agent processes, emulated links between
//! the campuses) kills the leader, partitions the south campus and heals
//! it; the report must show each consequence, in proxy mode and in the
//! packet-level mode (every process in its site's network namespace).

use std::io::Read as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const QUICK_FAILOVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/scenarios/quick-failover.toml"
);

const QUICK_EXCHANGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/scenarios/quick-exchange.toml"
);

#[test]
fn the_agents_exchange_every_round_through_the_link_and_the_rounds_commit() {
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let (output, _) = run_bounded(Command::new(env!("CARGO_BIN_EXE_longhaul")).args([
        "rehearse",
        QUICK_EXCHANGE,
        "--output",
        "json",
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rounds = &report["rounds"];
    assert_eq!(rounds["elements_per_fragment"], 65_536, "{rounds:#}");
    // A round commits only when both sites applied one hash per fragment:
    // each commit is the two agents' reduced fragments agreeing bit for bit.
    let committed: Vec<&Value> = rounds["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "committed")
        .collect();
    assert!(committed.len() >= 2, "{rounds:#}\n{stderr}");
    for round in &committed {
        assert_eq!(round["participants"], serde_json::json!(["north", "south"]));
        // What the agents reported exchanging: real bytes, both ways.
        assert!(round["bytes"].as_u64().unwrap() > 0, "{round:#}");
        assert!(round["exchange_ms"].as_u64().is_some(), "{round:#}");
    }
    // Beside each with both sites live, the simulator: south starts one
    // way (80 km and 20 µs: 0.42 ms) after north, the replica's site;
    // encoding is timed once and charged alike; the discrete-event tier
    // on the same link takes a hello's round trip and two one-way trips
    // at least, and, the link losing nothing at random, the same for
    // every round of the same sites and size. A round that went on
    // without south (its agent killed) has nothing to exchange over the
    // link, and no simulation.
    let (both, alone): (Vec<&&Value>, Vec<&&Value>) = committed
        .iter()
        .partition(|r| r["excluded"].as_array().is_some_and(|e| e.is_empty()));
    assert!(both.len() >= 2, "{rounds:#}");
    for round in alone {
        assert!(round["simulated_ms"].is_null(), "{round:#}");
    }
    let simulated: Vec<f64> = both
        .iter()
        .map(|r| {
            r["simulated_ms"]
                .as_f64()
                .unwrap_or_else(|| panic!("{r:#}"))
        })
        .collect();
    assert!(
        simulated.iter().all(|s| *s == simulated[0]),
        "{simulated:?}"
    );
    let parts = &both[0]["simulated"];
    let part = |name: &str| parts[name].as_f64().unwrap_or_else(|| panic!("{parts:#}"));
    assert!((part("start_ms") - 0.42).abs() < 1e-6, "{parts:#}");
    assert!(part("encode_ms") > 0.0, "{parts:#}");
    assert!(part("links_ms") >= 4.0 * 0.42, "{parts:#}");
    assert!(
        (part("start_ms") + part("encode_ms") + part("links_ms") - simulated[0]).abs() < 1e-9,
        "{parts:#}"
    );
    assert!(
        rounds["median_measured_over_simulated"].as_f64().unwrap() > 0.0,
        "{rounds:#}"
    );
    let link = &rounds["links"][0];
    assert_eq!(link["link"], "north<->south", "{rounds:#}");
    assert!(link["bytes"].as_u64().unwrap() > 0, "{link:#}");
    // The kill of south's agent: the round open then goes on without it
    // or is aborted (the job cannot be placed on one campus); never
    // committed with its hash missing.
    let timeline = report["timeline"].as_array().unwrap();
    assert!(
        timeline.iter().any(|r| r["kind"] == "round"
            && r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("aborted") || d.contains("without south"))),
        "{timeline:#?}"
    );
}

#[test]
fn a_rehearsal_reports_the_new_leader_the_partitioned_site_and_the_re_plan() {
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let (output, _) = run_bounded(Command::new(env!("CARGO_BIN_EXE_longhaul")).args([
        "rehearse",
        QUICK_FAILOVER,
        "--output",
        "json",
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["emulator_mode"], "proxy");
    check_failover(&report, &stderr);
}

/// What the quick-failover scenario must show, whatever the mode.
fn check_failover(report: &Value, stderr: &str) {
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

/// Why the packet-level mode cannot run here (what the emulator's own
/// check finds missing), or `None` where it can. With
/// `LONGHAUL_REQUIRE_PACKET=1` (as `.ci/run` sets) a machine that cannot
/// run it fails the tests instead.
fn packet_mode_unavailable() -> Option<String> {
    let missing = longhaul_simulations::emulator::packet::netns::check_support().err()?;
    if std::env::var("LONGHAUL_REQUIRE_PACKET").is_ok_and(|v| v == "1") {
        panic!("LONGHAUL_REQUIRE_PACKET=1, but {missing}");
    }
    Some(missing.to_string())
}

/// The network namespaces the rehearsal process `pid` created that still
/// exist, from `ip netns list`.
fn namespaces_of(pid: u32) -> Vec<String> {
    let output = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let prefix = format!("lh-{pid}-");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Runs `command` to its end, killed after four minutes (a rehearsal of
/// the 20 s scenario takes well under one); its output and process id.
pub(crate) fn run_bounded(command: &mut Command) -> (Output, u32) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // SIGTERM first, so that it removes what it created.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the rehearsal did not finish within 4 minutes:\n{}",
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    (output, pid)
}

#[test]
fn a_packet_mode_rehearsal_runs_each_process_in_its_site_namespace_and_says_so() {
    if let Some(reason) = packet_mode_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let keep = tempfile::tempdir().unwrap();
    let (output, pid) = run_bounded(Command::new(env!("CARGO_BIN_EXE_longhaul")).args([
        "rehearse",
        QUICK_FAILOVER,
        "--mode",
        "packet",
        "--output",
        "json",
        "--keep",
        &keep.path().display().to_string(),
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Whatever happened, nothing is left behind.
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{stderr}");
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["emulator_mode"], "packet");
    let sites: Vec<(&str, &str)> = report["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["site"].as_str().unwrap(), s["address"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sites,
        [("north", "198.18.0.1"), ("south", "198.18.0.2")],
        "{report:#}"
    );
    assert!(stderr.contains("in packet mode"), "{stderr}");
    check_failover(&report, &stderr);
    // Each replica served on its site's address (inside its namespace),
    // and reached its peers at theirs.
    for (id, address) in [(1, "198.18.0.1:7700"), (3, "198.18.0.2:7702")] {
        let log = std::fs::read_to_string(keep.path().join(format!("replica-{id}.log"))).unwrap();
        assert!(
            log.contains(&format!("local_addr={address}")),
            "replica {id}:\n{log}"
        );
    }
}

#[test]
fn a_packet_mode_rehearsal_stopped_midway_removes_its_namespaces() {
    if let Some(reason) = packet_mode_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["rehearse", QUICK_FAILOVER, "--mode", "packet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Its files' directory, which its processes' command lines name.
    let files = format!("longhaul-rehearsal-{pid}-");
    // Wait for its sites' namespaces and its replicas in them (bounded),
    // then stop it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces_of(pid).len() < 2 || processes_naming(&files).len() < 3 {
        assert!(
            Instant::now() < deadline,
            "no namespaces and replicas after 60 s: {:?}",
            child.try_wait()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the rehearsal did not stop within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stopped by a signal"), "{stderr}");
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{stderr}");
    assert_eq!(processes_naming(&files), Vec::<u32>::new(), "{stderr}");
}

/// The processes whose command line names `needle`, from `/proc`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn after_a_packet_mode_rehearsal_is_killed_its_processes_exit_and_the_next_run_removes_its_namespaces()
 {
    if let Some(reason) = packet_mode_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let keep = tempfile::tempdir().unwrap();
    let keep_dir = keep.path().display().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args([
            "rehearse",
            QUICK_FAILOVER,
            "--mode",
            "packet",
            "--keep",
            &keep_dir,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // It and its three replicas and two agents run, those in its
    // namespaces (bounded).
    let deadline = Instant::now() + Duration::from_secs(90);
    while namespaces_of(pid).len() < 2 || processes_naming(&keep_dir).len() < 6 {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no namespaces and 6 processes after 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SIGKILL: nothing of it runs to clean up.
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !processes_naming(&keep_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "orphaned processes still run 60 s after the rehearsal was killed: {:?}",
            processes_naming(&keep_dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The next packet-mode emulator removes what the killed one left.
    assert_eq!(namespaces_of(pid).len(), 2);
    let (output, _) = run_bounded(Command::new(env!("CARGO_BIN_EXE_longhaul")).args([
        "emulate",
        QUICK_FAILOVER,
        "--mode",
        "packet",
        "--duration",
        "1 s",
        "--control",
        "127.0.0.1:0",
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{stderr}");
}

#[test]
fn without_the_privileges_packet_mode_says_what_is_missing_and_suggests_proxy_mode() {
    // As root, drop every capability for the child; otherwise the
    // machine lacks them already.
    let mut command = if packet_mode_unavailable().is_none() {
        if Command::new("setpriv").arg("--version").output().is_err() {
            println!("skipped: running as root and no setpriv to drop capabilities");
            return;
        }
        let mut command = Command::new("setpriv");
        command.args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            env!("CARGO_BIN_EXE_longhaul"),
        ]);
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_longhaul"))
    };
    let (output, pid) = run_bounded(command.args(["rehearse", QUICK_FAILOVER, "--mode", "packet"]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--mode packet"), "{stderr}");
    assert!(stderr.contains("CAP_NET_ADMIN"), "{stderr}");
    assert!(stderr.contains("--mode proxy"), "{stderr}");
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
}
