//! The `longhaul` CLI as a user runs it: arguments in, text and exit status
//! out. The commands run in-process through the same `run` the binary calls.

use clap::Parser;
use longhaul_cli::{Cli, run};

use crate::util::repo_root;

/// Runs `longhaul ARGS...` and returns (status, stdout, stderr).
fn longhaul(args: &[&str]) -> (u8, String, String) {
    let cli = Cli::try_parse_from(std::iter::once("longhaul").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("arguments {args:?} rejected: {e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = run(cli, &mut out, &mut err);
    (
        status,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn example(name: &str) -> String {
    repo_root()
        .join("deploy/examples")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn show_without_a_file_uses_the_bundled_topology() {
    let (status, out, err) = longhaul(&["topology", "show"]);
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("topology two-campuses-80km: 2 sites, 4,352 GPUs"),
        "{out}"
    );
    // The WAN table gives RTT and BDP: 80 km × 5 µs/km + 20 µs = 420 µs one way.
    assert!(out.contains("north – south"), "{out}");
    assert!(out.contains("840 µs"), "{out}");
    assert!(out.contains("40.1 MiB"), "{out}");
}

#[test]
fn show_prints_every_site_and_building_of_a_large_topology() {
    let (status, out, err) = longhaul(&["topology", "show", &example("hyperscale-plus-two.toml")]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains("100,008 GPUs"), "{out}");
    for name in [
        "flagship",
        "hall-a",
        "hall-d",
        "lakeside",
        "prairie",
        "flagship – prairie",
    ] {
        assert!(out.contains(name), "{name} missing from\n{out}");
    }
    // Readable at a glance: a short report, not one line per GPU.
    assert!(out.lines().count() < 60, "{} lines", out.lines().count());
}

#[test]
fn json_output_is_machine_readable() {
    let (status, out, _) = longhaul(&[
        "topology",
        "show",
        "--output",
        "json",
        &example("three-sites-two-continents.toml"),
    ]);
    assert_eq!(status, 0);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["sites"].as_array().unwrap().len(), 3);
    let rtt = value["links"][0]["figures"]["rtt_seconds"]
        .as_f64()
        .unwrap();
    // Paris–Frankfurt: 2 × (500 km × 5 µs/km + 50 µs) = 5.1 ms.
    assert!((rtt - 0.0051).abs() < 1e-12, "{rtt}");
}

#[test]
fn check_reports_success_in_one_line() {
    let (status, out, _) = longhaul(&["topology", "check", &example("two-campuses-500km.toml")]);
    assert_eq!(status, 0);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("2 sites, 4,352 GPUs, 1 WAN links"), "{out}");
}

#[test]
fn an_invalid_file_exits_2_and_names_file_line_and_field() {
    let dir = std::env::temp_dir().join(format!("longhaul-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "name = \"x\"\n[[sites]]\nid = \"a\"\nbuildings = []\n",
    )
    .unwrap();
    let (status, out, err) = longhaul(&["topology", "check", &path.display().to_string()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, 2);
    assert_eq!(out, "");
    assert!(
        err.contains("bad.toml:4:13: field `sites[0].buildings`: site \"a\" has no GPUs"),
        "{err}"
    );
}

#[test]
fn a_missing_file_exits_2_and_says_so() {
    let (status, _, err) = longhaul(&["topology", "check", "/nonexistent/longhaul.toml"]);
    assert_eq!(status, 2);
    assert!(
        err.starts_with("/nonexistent/longhaul.toml: field `(document)`: cannot read file"),
        "{err}"
    );
}

#[test]
fn job_check_against_a_topology_locates_the_problem_in_the_job_file() {
    let (status, out, err) = longhaul(&[
        "job",
        "check",
        &example("dense-400b.job.toml"),
        "--topology",
        &example("two-campuses-80km.toml"),
    ]);
    assert_eq!(status, 2, "{out}");
    assert!(err.contains("dense-400b.job.toml:23:18:"), "{err}");
    assert!(
        err.contains("field `constraints.allowed_sites[0]`: unknown site \"paris\""),
        "{err}"
    );
}

#[test]
fn every_bundled_scenario_checks() {
    for path in crate::util::files_in("scenarios", ".toml") {
        let (status, out, err) = longhaul(&["scenario", "check", &path.display().to_string()]);
        assert_eq!(status, 0, "{}: {err}", path.display());
        assert!(out.starts_with("ok: "), "{out}");
    }
}

#[test]
fn help_explains_every_command() {
    for args in [
        &["--help"][..],
        &["topology", "--help"],
        &["topology", "show", "--help"],
        &["job", "check", "--help"],
    ] {
        let error = Cli::try_parse_from(std::iter::once("longhaul").chain(args.iter().copied()))
            .unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        let help = error.to_string();
        assert!(help.contains("Usage: longhaul"), "{help}");
    }
    let help = Cli::try_parse_from(["longhaul", "topology", "--help"])
        .unwrap_err()
        .to_string();
    assert!(help.contains("check") && help.contains("show"), "{help}");
}

#[test]
fn plan_without_files_places_the_bundled_job_on_the_bundled_topology() {
    let (status, out, err) = longhaul(&["plan"]);
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("plan for llama-70b on two-campuses-80km: "),
        "{out}"
    );
    assert!(out.contains("predicted step time"), "{out}");
    assert!(out.contains("\nwhy\n  objective: fastest step — "), "{out}");
    assert!(out.contains("\n  mode: "), "{out}");
    assert!(out.contains("\n  site search: exact — "), "{out}");
}

#[test]
fn plan_json_replays_and_keeps_tp_inside_domains() {
    let (status, out, err) = longhaul(&[
        "plan",
        "--topology",
        &example("three-sites-two-continents.toml"),
        "--job",
        &example("dense-400b.job.toml"),
        "--output",
        "json",
    ]);
    assert_eq!(status, 0, "{err}");
    let plan: longhaul_core::placement::Plan = serde_json::from_str(&out).unwrap();
    // Across continents the sites train DiLoCo replicas, not one pipeline.
    assert!(
        matches!(
            plan.mode,
            longhaul_core::placement::CrossSiteMode::Diloco { .. }
        ),
        "{:?}",
        plan.mode
    );
    assert!(plan.degrees.tensor_parallel <= 8);
    let topology = longhaul_core::Topology::from_toml(
        "t.toml",
        &std::fs::read_to_string(example("three-sites-two-continents.toml")).unwrap(),
    )
    .unwrap();
    let job = longhaul_core::JobSpec::from_toml(
        "j.toml",
        &std::fs::read_to_string(example("dense-400b.job.toml")).unwrap(),
    )
    .unwrap();
    longhaul_core::placement::validate_plan(&topology, &job, &plan).unwrap();
}

#[test]
fn sync_plan_json_names_its_figures_and_matches_the_placed_plan() {
    let (status, out, err) = longhaul(&[
        "sync",
        "plan",
        "--topology",
        &example("three-sites-two-continents.toml"),
        "--job",
        &example("dense-400b.job.toml"),
        "--output",
        "json",
    ]);
    assert_eq!(status, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    for field in [
        "inner_steps",
        "fragments",
        "overlap_steps",
        "predicted_compute_utilisation",
        "reduction_vs_sync_dp",
        "links",
    ] {
        assert!(!doc[field].is_null(), "no {field} in {out}");
    }
    for link in doc["links"].as_array().unwrap() {
        assert!(
            link["bits"]
                .as_u64()
                .is_some_and(|b| [4, 8, 16].contains(&b))
        );
        assert!(
            link["bytes_per_outer_step"]
                .as_f64()
                .is_some_and(|b| b > 0.0)
        );
    }
    let u = doc["predicted_compute_utilisation"].as_f64().unwrap();
    assert!(u > 0.0 && u <= 1.0, "a fraction, not a percentage: {u}");
    // The document is the schedule `plan` placed the job with.
    let (_, plan_out, _) = longhaul(&[
        "plan",
        "--topology",
        &example("three-sites-two-continents.toml"),
        "--job",
        &example("dense-400b.job.toml"),
        "--output",
        "json",
    ]);
    let plan: longhaul_core::placement::Plan = serde_json::from_str(&plan_out).unwrap();
    let sync: longhaul_core::sync::SyncPlan = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(plan.sync, Some(sync));
    assert!(doc["placement_preferred"].is_null());
}

#[test]
fn sync_plan_of_a_job_placed_as_a_pipeline_plans_its_best_diloco_placement_and_says_so() {
    let (status, out, err) = longhaul(&[
        "sync",
        "plan",
        "--topology",
        &example("two-campuses-500km.toml"),
    ]);
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("sync plan for llama-70b on two-campuses-500km: DiLoCo"),
        "{out}"
    );
    assert!(
        out.contains("note: placement prefers a cross-site pipeline"),
        "{out}"
    );
    assert!(
        out.contains("\nlinks\n") && out.contains("north – south"),
        "{out}"
    );
    assert!(out.contains("\nwhy\n  inner_steps: "), "{out}");
    // A job that forbids DiLoCo has nothing to plan: a clear error.
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("pipeline.job.toml");
    let text = std::fs::read_to_string(example("llama-70b.job.toml"))
        .unwrap()
        .replace(
            "max_tensor_parallel = 8",
            "max_tensor_parallel = 8\ncross_site_mode = \"pipeline\"",
        );
    std::fs::write(&job, text).unwrap();
    let (status, _, err) = longhaul(&["sync", "plan", "--job", job.to_str().unwrap()]);
    assert_eq!(status, 1, "{err}");
    assert!(err.contains("cross_site_mode = \"pipeline\""), "{err}");
    // An unknown mode is an invalid file, named with its line.
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("\"pipeline\"", "\"ring\"");
    std::fs::write(&job, text).unwrap();
    let (status, _, err) = longhaul(&["sync", "plan", "--job", job.to_str().unwrap()]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("cross_site_mode"), "{err}");
}

#[test]
fn an_infeasible_plan_says_why() {
    let (status, _, err) = longhaul(&[
        "plan",
        "--topology",
        &example("two-campuses-80km.toml"),
        "--job",
        &example("dense-400b.job.toml"),
    ]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("unknown site \"paris\""), "{err}");
}

#[test]
fn a_job_that_fits_nowhere_exits_2_as_invalid_input_does() {
    let dir = tempfile::tempdir().unwrap();
    let job = std::fs::read_to_string(example("llama-70b.job.toml")).unwrap();
    let huge = job.replace(
        "parameters = 70_600_000_000",
        "parameters = 100_000_000_000_000",
    );
    assert_ne!(huge, job, "the example's parameter line changed");
    let path = dir.path().join("huge.job.toml");
    std::fs::write(&path, huge).unwrap();
    let (status, out, err) = longhaul(&[
        "plan",
        "--topology",
        &example("two-campuses-80km.toml"),
        "--job",
        &path.display().to_string(),
    ]);
    assert_eq!(status, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("cannot be placed") && err.contains("memory does not fit"),
        "{err}"
    );
}

#[test]
fn simulate_compares_the_modes_over_distance_and_says_where_each_stops_being_viable() {
    let (topology, job) = (
        example("three-sites-two-continents.toml"),
        example("dense-400b.job.toml"),
    );
    let args = [
        "simulate",
        "--topology",
        &topology,
        "--job",
        &job,
        "--sweep",
        "distance-km=10,10000",
        "--output",
        "json",
    ];
    let (status, out, err) = longhaul(&args);
    assert_eq!(status, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    let outcome = |p: usize, mode: &str| {
        points[p]["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} at point {p}: {out}"))
            .clone()
    };
    let figure = |o: &serde_json::Value, key: &str| o[key].as_f64().unwrap();
    // Synchronous DP moves the whole gradient every step at any distance, DiLoCo a small
    // fraction of it; at 10,000 km DiLoCo is still viable and synchronous DP is not.
    let (dp_far, diloco_far) = (outcome(1, "sync-dp"), outcome(1, "diloco"));
    assert_eq!(
        figure(&outcome(0, "sync-dp"), "wan_bytes_per_step"),
        figure(&dp_far, "wan_bytes_per_step")
    );
    assert!(
        figure(&dp_far, "wan_bytes_per_step") > 100.0 * figure(&diloco_far, "wan_bytes_per_step")
    );
    assert_eq!(diloco_far["viable"], true, "{out}");
    assert_eq!(dp_far["viable"], false, "{out}");
    assert!(figure(&dp_far, "step_seconds") > figure(&outcome(0, "sync-dp"), "step_seconds"));
    assert!(points[1]["rtt_seconds"].as_f64().unwrap() > 0.1);

    let (status, text, _) = longhaul(&args[..args.len() - 2]);
    assert_eq!(status, 0);
    assert!(text.contains("diloco    viable at every point"), "{text}");
    assert!(text.contains("sync-dp"), "{text}");

    // A value out of range is refused by the argument parser (exit 2), naming the axis.
    let error = Cli::try_parse_from(["longhaul", "simulate", "--sweep", "loss=0.5,2"]).unwrap_err();
    assert!(error.to_string().contains("loss"), "{error}");
    assert_eq!(error.exit_code(), 2);
}
