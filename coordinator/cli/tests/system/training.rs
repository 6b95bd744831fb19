//! A real model trained across two emulated campuses through the agents'
//! trainer API (`[training]` in a rehearsal scenario): the example
//! character-level model (`longhaul.examples.chars`, NumPy), once with
//! synchronous data parallelism (every step's gradient averaged through
//! the agents) and once with DiLoCo (H = 20, 4-bit pseudo-gradients), on
//! the same data, steps and seed. DiLoCo must reach the synchronous run's
//! held-out loss within a stated tolerance with far fewer bytes exchanged,
//! and every site must end with the same parameters.
//!
//! Needs Python 3 with `grpcio`, `protobuf` and `numpy` (`.ci/run`
//! installs them); skipped without them unless `LONGHAUL_REQUIRE_PYTHON=1`.
//! The same DiLoCo run through the PyTorch adapter (`--framework torch`)
//! runs where that Python imports torch, and is skipped, saying so,
//! elsewhere (CI has no torch: PyPI's is a multi-GB CUDA build).
//! `LONGHAUL_PYTHON` names another interpreter (default `python3`), e.g.
//! a virtual environment that has torch.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Inner steps of each run: enough for the loss to fall well below the
/// uniform 4.16 nats, few enough for a debug build on two cores.
const STEPS: u32 = 200;
/// DiLoCo's held-out loss may exceed the synchronous run's by this much
/// after so few outer steps (10 of H = 20).
const LOSS_TOLERANCE: f64 = 0.3;
/// The exchanges of synchronous data parallelism (bf16 every step) must
/// move at least this many times DiLoCo's (4-bit every 20 steps: 80x in
/// theory).
const BYTES_FACTOR: f64 = 20.0;
/// A held-out loss below this learned something: uniform guessing over 64
/// classes is ln 64 = 4.16 nats.
const LEARNED: f64 = 3.3;

fn python_path() -> PathBuf {
    Path::new(ROOT).join("site-agent/python")
}

/// The interpreter the trainers run on: `LONGHAUL_PYTHON` or `python3`.
fn python() -> String {
    std::env::var("LONGHAUL_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Why the Python side cannot run here, or `None`.
pub(crate) fn python_unavailable() -> Option<String> {
    let probe = Command::new(python())
        .args(["-c", "import grpc, numpy, google.protobuf, longhaul"])
        .env("PYTHONPATH", python_path())
        .output();
    let missing = match probe {
        Ok(output) if output.status.success() => return None,
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_string(),
        Err(error) => format!("no {}: {error}", python()),
    };
    if std::env::var("LONGHAUL_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
        panic!("LONGHAUL_REQUIRE_PYTHON=1, but the Python package cannot be imported: {missing}");
    }
    Some(missing)
}

/// A job file like the bundled `chars-diloco.job.toml` with H = `h` and
/// `bits`, and a scenario training it for [`STEPS`] steps in `framework`
/// (`numpy` or `torch`); the scenario.
fn write_scenario(dir: &Path, name: &str, h: u32, bits: u32, framework: &str) -> PathBuf {
    write_scenario_with(dir, name, h, bits, framework, STEPS, "")
}

/// [`write_scenario`] with `steps` and `extra` appended to the scenario
/// (a timeline).
fn write_scenario_with(
    dir: &Path,
    name: &str,
    h: u32,
    bits: u32,
    framework: &str,
    steps: u32,
    extra: &str,
) -> PathBuf {
    let job =
        std::fs::read_to_string(Path::new(ROOT).join("deploy/examples/chars-diloco.job.toml"))
            .unwrap()
            .replace("inner_steps = 250", &format!("inner_steps = {h}"))
            .replace("max_inner_steps = 250", &format!("max_inner_steps = {h}"))
            .replace("bits = 4", &format!("bits = {bits}"));
    assert!(job.contains(&format!("inner_steps = {h}")), "{job}");
    write_job_and_scenario(dir, name, &job, framework, steps, extra)
}

/// `job` (a job file's text) in `dir`, and a scenario training it for
/// `steps` steps in `framework` with `extra` appended; the scenario.
fn write_job_and_scenario(
    dir: &Path,
    name: &str,
    job: &str,
    framework: &str,
    steps: u32,
    extra: &str,
) -> PathBuf {
    let job_path = dir.join(format!("{name}.job.toml"));
    std::fs::write(&job_path, job).unwrap();
    let scenario = format!(
        r#"name = "{name}"
seed = 3
topology = "{root}/deploy/examples/two-campuses-80km.toml"
job = "{job}"
duration = "4 min"

[coordinator]
replicas = 1
sites = ["north"]

[training]
command = ["{python}", "-m", "longhaul.examples.chars", "--steps", "{steps}", "--eval-every", "50", "--framework", "{framework}"]
{extra}"#,
        root = ROOT,
        python = python(),
        job = job_path.display(),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, scenario).unwrap();
    path
}

fn rehearse(scenario: &Path) -> Value {
    let (output, _) = super::rehearse::run_bounded(
        Command::new(env!("CARGO_BIN_EXE_longhaul"))
            .args([
                "rehearse",
                &scenario.display().to_string(),
                "--output",
                "json",
            ])
            .env("PYTHONPATH", python_path()),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rehearse failed:\n{stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The site's trainer ended with exit status 0.
fn assert_exited_cleanly(site: &Value) {
    assert!(
        site["exit"]
            .as_str()
            .is_some_and(|e| e.ends_with("exit status: 0")),
        "{site:#}"
    );
}

/// Every trainer finished, every site ended with the same parameters;
/// the final held-out loss and the bytes the exchanges moved.
fn check_run(report: &Value, mode: &str) -> (f64, f64) {
    let training = &report["training"];
    let sites = training["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2, "{training:#}");
    for site in sites {
        assert_exited_cleanly(site);
        let run = &site["run"];
        assert_eq!(run["mode"], mode, "{run:#}");
        assert_eq!(run["steps"], STEPS, "{run:#}");
        // Not one round missed: each site applied every outer step.
        let rounds = run["rounds"].as_array().unwrap();
        assert!(rounds.iter().all(|r| r["applied"] == true), "{run:#}");
        assert_eq!(
            rounds[0]["live_sites"],
            serde_json::json!(["north", "south"])
        );
    }
    assert_eq!(training["same_parameters"], true, "{training:#}");
    let loss = sites[0]["run"]["final_held_out_loss"].as_f64().unwrap();
    assert!(loss < LEARNED, "{mode}: held-out loss {loss}");
    (loss, training["exchange_bytes"].as_f64().unwrap())
}

#[test]
fn diloco_through_the_agents_matches_synchronous_training_with_far_fewer_bytes() {
    if let Some(missing) = python_unavailable() {
        eprintln!("skipped: {missing}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let sync = rehearse(&write_scenario(dir.path(), "train-sync", 1, 16, "numpy"));
    let diloco = rehearse(&write_scenario(dir.path(), "train-diloco", 20, 4, "numpy"));
    let (sync_loss, sync_bytes) = check_run(&sync, "sync-dp");
    let (diloco_loss, diloco_bytes) = check_run(&diloco, "diloco");
    // The trainers' measured inner step reached the coordinator's rounds
    // (which set the next deadline from it).
    let rounds = diloco["rounds"]["rounds"].as_array().unwrap();
    let measured: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r["inner_step_ms"].as_f64())
        .collect();
    assert!(
        !measured.is_empty() && measured.iter().all(|ms| *ms > 0.0 && *ms < 60_000.0),
        "{rounds:#?}"
    );
    assert_eq!(
        sync["training"]["sites"][0]["run"]["rounds"]
            .as_array()
            .unwrap()
            .len(),
        STEPS as usize
    );
    assert_eq!(
        diloco["training"]["sites"][0]["run"]["rounds"]
            .as_array()
            .unwrap()
            .len(),
        (STEPS / 20) as usize
    );
    eprintln!(
        "held-out loss: synchronous {sync_loss:.4}, DiLoCo {diloco_loss:.4}; bytes exchanged: {sync_bytes} vs {diloco_bytes} ({:.0}x)",
        sync_bytes / diloco_bytes
    );
    assert!(
        diloco_loss <= sync_loss + LOSS_TOLERANCE,
        "DiLoCo {diloco_loss} vs synchronous {sync_loss}"
    );
    assert!(
        sync_bytes >= BYTES_FACTOR * diloco_bytes,
        "synchronous {sync_bytes} B vs DiLoCo {diloco_bytes} B"
    );
}

#[test]
fn trainers_slower_than_predicted_get_the_sync_replanned_at_their_measured_step() {
    if let Some(missing) = python_unavailable() {
        eprintln!("skipped: {missing}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    // H free between 20 and 100: placement's microseconds per step make it
    // 100; the trainers' milliseconds make it 20 once measured.
    let job = std::fs::read_to_string(
        Path::new(ROOT).join("deploy/examples/chars-diloco-replan.job.toml"),
    )
    .unwrap()
    .replace("max_inner_steps = 200", "max_inner_steps = 100");
    assert!(job.contains("max_inner_steps = 100"), "{job}");
    let steps = 400;
    let report = rehearse(&write_job_and_scenario(
        dir.path(),
        "train-replan",
        &job,
        "numpy",
        steps,
        "",
    ));
    // The committed ones: the round opened after the last is never run.
    let rounds: Vec<&Value> = report["rounds"]["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "committed")
        .collect();
    let h: Vec<u64> = rounds
        .iter()
        .map(|r| r["inner_steps"].as_u64().unwrap_or(0))
        .collect();
    // The placed H, then (after the round that measured the step and the
    // one already under way) the re-planned one, and no going back.
    let switch = h.iter().position(|&h| h != 100).unwrap_or(h.len());
    assert!(switch >= 2, "re-planned before any round measured: {h:?}");
    assert!(switch < h.len(), "never re-planned: {h:?}");
    assert!(h[switch..].iter().all(|&h| h == 20), "{h:?}");
    assert!(
        rounds[switch]["overlap_steps"].as_u64().unwrap_or(0) == 0,
        "{:#}",
        rounds[switch]
    );
    let timeline = report["timeline"].to_string();
    assert!(
        timeline.contains("re-planned at the trainers"),
        "{timeline}"
    );
    let training = &report["training"];
    let sites = training["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2, "{training:#}");
    for site in sites {
        assert_exited_cleanly(site);
        let run = &site["run"];
        assert_eq!(run["steps"], steps, "{run:#}");
        let ran: Vec<u64> = run["rounds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["inner_steps"].as_u64().unwrap())
            .collect();
        // Each outer step ran the H its round was opened with.
        assert_eq!(ran, h, "{run:#}");
        let last = run["rounds"].as_array().unwrap().last().unwrap();
        assert_eq!(last["inner_steps_through"], steps, "{run:#}");
    }
    assert_eq!(training["same_parameters"], true, "{training:#}");
    let loss = sites[0]["run"]["final_held_out_loss"].as_f64().unwrap();
    assert!(loss < LEARNED, "held-out loss {loss}");
}

#[test]
fn the_pytorch_adapter_trains_the_same_model_with_diloco_through_the_agents() {
    if let Some(missing) = python_unavailable() {
        eprintln!("skipped: {missing}");
        return;
    }
    let torch = Command::new(python())
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !torch {
        eprintln!(
            "skipped: {} cannot import torch (set LONGHAUL_PYTHON to one that can)",
            python()
        );
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let report = rehearse(&write_scenario(dir.path(), "train-torch", 20, 4, "torch"));
    let (loss, bytes) = check_run(&report, "diloco");
    for site in report["training"]["sites"].as_array().unwrap() {
        assert_eq!(site["run"]["framework"], "torch", "{site:#}");
        assert_eq!(
            site["run"]["rounds"].as_array().unwrap().len(),
            (STEPS / 20) as usize
        );
    }
    eprintln!("PyTorch DiLoCo: held-out loss {loss:.4}, {bytes} bytes exchanged");
}

/// The south campus's agent killed in the middle of DiLoCo training and
/// started again (as `deploy/scenarios/train-chars-site-loss.toml`): the
/// open round is aborted (or, when the kill falls between rounds, the next
/// round commits without south, which then catches up), both trainers
/// train on locally and rejoin, and the job ends in one round with the
/// same parameters at both sites, each having kept the anchor of the last
/// round it applied.
#[test]
fn a_site_killed_mid_training_rejoins_and_every_site_ends_with_the_same_parameters() {
    if let Some(missing) = python_unavailable() {
        eprintln!("skipped: {missing}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    // 60 rounds of H = 20: on an idle machine rounds take ~0.1 s and 30 of
    // them ended before the kill 6 s after placement (seen in CI); 60 keep
    // it inside training whether the machine is idle or loaded.
    let steps = 1200;
    let timeline = r#"
[[timeline]]
at = "6 s"
action = "kill-agent"
site = "south"

[[timeline]]
at = "12 s"
action = "restart-agent"
site = "south"
"#;
    let report = rehearse(&write_scenario_with(
        dir.path(),
        "train-site-loss",
        20,
        4,
        "numpy",
        steps,
        timeline,
    ));
    let rounds = &report["rounds"];
    let without_south = rounds["rounds"].as_array().unwrap().iter().any(|r| {
        r["state"] == "committed"
            && r["excluded"]
                .as_array()
                .is_some_and(|e| e.iter().any(|s| s == "south (site_down)"))
    });
    assert!(
        rounds["aborted"].as_u64().unwrap() >= 1 || without_south,
        "the kill did not land inside training: {rounds:#}"
    );
    let training = &report["training"];
    let sites = training["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2, "{training:#}");
    let mut last_rounds = Vec::new();
    for site in sites {
        assert_exited_cleanly(site);
        let run = &site["run"];
        let history = run["rounds"].as_array().unwrap();
        last_rounds.push(history.last().unwrap()["round"].clone());
        // The last outer step was averaged at this site.
        assert_eq!(history.last().unwrap()["applied"], true, "{run:#}");
        let loss = run["final_held_out_loss"].as_f64().unwrap();
        assert!(loss < LEARNED, "{}: held-out loss {loss}", site["site"]);
    }
    assert_eq!(last_rounds[0], (steps / 20) as u64, "{training:#}");
    assert_eq!(last_rounds[0], last_rounds[1], "{training:#}");
    assert_eq!(training["same_parameters"], true, "{training:#}");
}

/// Three campuses, the east campus's agent killed in the middle of DiLoCo
/// training and started again (`deploy/scenarios/
/// train-chars-three-sites-site-loss.toml`): north commits a round
/// without east; the next round names east as catching up, its agent
/// fetches the anchor and outer momentum after that round from a campus
/// that applied it, its trainer loads them, and every campus ends in the
/// job's last round with the same parameters. Without the catch-up east
/// ends one anchor behind, with different parameters.
#[test]
fn a_site_excluded_from_a_committed_round_catches_up_and_every_site_ends_the_same() {
    if let Some(missing) = python_unavailable() {
        eprintln!("skipped: {missing}");
        return;
    }
    let _serial = crate::ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let scenarios = Path::new(ROOT).join("deploy/scenarios");
    let shipped =
        std::fs::read_to_string(scenarios.join("train-chars-three-sites-site-loss.toml")).unwrap();
    let examples = Path::new(ROOT).join("deploy/examples");
    let scenario = shipped
        .replace("\"../examples/", &format!("\"{}/", examples.display()))
        .replace("[\"python3\"", &format!("[\"{}\"", python()));
    assert!(scenario.contains(&python()), "{scenario}");
    let path = dir.path().join("three-sites-site-loss.toml");
    std::fs::write(&path, scenario).unwrap();
    let report = rehearse(&path);
    let training = &report["training"];
    let sites = training["sites"].as_array().unwrap();
    // The job runs on the two near campuses (the far one is its spare).
    assert_eq!(sites.len(), 2, "{training:#}");
    let history = |site: &str| {
        sites
            .iter()
            .find(|s| s["site"] == site)
            .unwrap_or_else(|| panic!("no trainer at {site}: {training:#}"))["run"]["rounds"]
            .as_array()
            .unwrap()
            .clone()
    };
    // A round the others committed without east.
    let north = history("north");
    let without_east: Vec<u64> = north
        .iter()
        .filter(|r| {
            r["applied"] == true
                && !r["live_sites"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s == "east")
        })
        .map(|r| r["round"].as_u64().unwrap())
        .collect();
    assert!(
        !without_east.is_empty(),
        "the kill did not land inside training: {training:#}"
    );
    // East caught up after one of them and applied that round's successor.
    let east = history("east");
    let caught_up = east
        .iter()
        .find(|r| r["caught_up_from"] != "")
        .unwrap_or_else(|| panic!("east never caught up: {training:#}"));
    let after = caught_up["caught_up_after"].as_u64().unwrap();
    assert!(without_east.contains(&after), "{training:#}");
    assert_eq!(caught_up["applied"], true, "{training:#}");
    for site in sites {
        assert_exited_cleanly(site);
        let run = &site["run"];
        let last = run["rounds"].as_array().unwrap().last().unwrap().clone();
        // The job's last round: the outer step of the whole step budget.
        let last_round =
            run["step_budget"].as_u64().unwrap() / run["inner_steps"].as_u64().unwrap();
        assert_eq!(last["round"], last_round, "{run:#}");
        assert_eq!(last["applied"], true, "{run:#}");
        let loss = run["final_held_out_loss"].as_f64().unwrap();
        assert!(loss < LEARNED, "{}: held-out loss {loss}", site["site"]);
    }
    assert_eq!(training["same_parameters"], true, "{training:#}");
}
