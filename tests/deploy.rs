//! The deployment files in `deploy/` (systemd units, Kubernetes manifests,
//! Dockerfile), checked offline by `deploy/validate.py`, and the command
//! lines they run parsed by the binaries' own argument parsers, so a flag
//! renamed in the code cannot be left behind in a unit or a manifest.
//!
//! `validate.py` needs `kubernetes-validate` (`pip install -r
//! deploy/requirements.txt`) and `systemd-analyze`; without them it exits 77
//! and this test says why and passes, unless `LONGHAUL_REQUIRE_DEPLOY=1` is
//! set (then validate.py fails, and so does the test).

use std::path::PathBuf;
use std::process::{Command, Output};

use clap::Parser;

const REQUIRE: &str = "LONGHAUL_REQUIRE_DEPLOY";
/// What validate.py exits with when a tool it needs is missing.
const SKIPPED: i32 = 77;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `python3 deploy/validate.py ARGS` from the workspace root; `None` (after
/// saying why) when there is no python3 and the checks are not required.
fn validate(args: &[&str]) -> Option<Output> {
    match Command::new("python3")
        .arg("deploy/validate.py")
        .args(args)
        .current_dir(repo_root())
        .output()
    {
        Ok(output) => Some(output),
        Err(error) => {
            assert!(
                std::env::var_os(REQUIRE).is_none(),
                "{REQUIRE} is set but python3 cannot be run: {error}"
            );
            eprintln!("skipped: cannot run python3: {error}");
            None
        }
    }
}

#[test]
fn the_units_and_manifests_pass_the_offline_checks() {
    let Some(output) = validate(&[]) else { return };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    if output.status.code() == Some(SKIPPED) {
        eprintln!("skipped: deploy/validate.py could not run every check (see above)");
        return;
    }
    assert!(
        output.status.success(),
        "deploy/validate.py failed ({}):\n{stdout}{stderr}",
        output.status
    );
}

/// The flags of `site-agent`'s subcommands, by subcommand. Its parser is in
/// its binary (site-agent/src/bin/site-agent.rs), not in a library this
/// test can call, so they are listed here; keep them in step.
const SITE_AGENT_FLAGS: &[(&str, &[&str])] = &[
    ("run", &["--config", "--log"]),
    (
        "status",
        &["--config", "--address", "--timeout", "--output"],
    ),
    ("inventory", &["--config", "--nodes"]),
    ("probe", &["--config", "--address", "--timeout"]),
];

fn check_site_agent(argv: &[String]) -> Result<(), String> {
    let subcommand = argv.get(1).map(String::as_str).unwrap_or_default();
    let Some((_, flags)) = SITE_AGENT_FLAGS
        .iter()
        .find(|(name, _)| *name == subcommand)
    else {
        return Err(format!("`{subcommand}` is not a site-agent subcommand"));
    };
    for arg in &argv[2..] {
        let flag = arg.split('=').next().unwrap_or_default();
        if flag.starts_with("--") && !flags.contains(&flag) {
            return Err(format!("site-agent {subcommand} has no flag {flag}"));
        }
    }
    Ok(())
}

#[test]
fn every_command_line_in_the_units_and_manifests_parses() {
    let Some(output) = validate(&["--commands"]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(SKIPPED) {
        assert!(
            std::env::var_os(REQUIRE).is_none(),
            "{REQUIRE} is set but deploy/validate.py --commands skipped: {stderr}"
        );
        eprintln!("skipped: {stderr}");
        return;
    }
    assert!(
        output.status.success(),
        "deploy/validate.py --commands failed ({}): {stderr}",
        output.status
    );
    let commands: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let commands = commands.as_array().unwrap();
    let mut failures = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for command in commands {
        let source = command["source"].as_str().unwrap();
        let program = command["program"].as_str().unwrap();
        let argv: Vec<String> = command["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        println!("{source}: {}", argv.join(" "));
        *counts.entry(program.to_string()).or_default() += 1;
        let result = match program {
            "coordinator" => longhaul_coordinator::daemon::Args::try_parse_from(&argv)
                .map(drop)
                .map_err(|e| e.to_string()),
            "longhaul" => longhaul_cli::Cli::try_parse_from(&argv)
                .map(drop)
                .map_err(|e| e.to_string()),
            "site-agent" => check_site_agent(&argv),
            other => Err(format!("unexpected program {other}")),
        };
        if let Err(error) = result {
            failures.push(format!("{source}: `{}`: {error}", argv.join(" ")));
        }
    }
    assert!(
        failures.is_empty(),
        "command lines that do not parse:\n{}",
        failures.join("\n")
    );
    // A unit and a manifest run each daemon; the coordinator's probes run the CLI.
    for (program, least) in [("coordinator", 2), ("site-agent", 2), ("longhaul", 1)] {
        let found = counts.get(program).copied().unwrap_or_default();
        assert!(
            found >= least,
            "found {found} command lines of {program}, expected at least {least}: {counts:?}"
        );
    }
}
