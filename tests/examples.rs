//! Every bundled example parses, validates and round-trips.

use longhaul_core::{JobSpec, Scenario, Topology};

use crate::util::files_in;

#[test]
fn topology_examples_round_trip() {
    let files: Vec<_> = files_in("examples", ".toml")
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".job.toml"))
        .collect();
    assert!(
        files.len() >= 3,
        "expected at least three topology examples, found {files:?}"
    );
    for path in files {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let topology = Topology::from_toml(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let written = topology.to_toml().unwrap();
        let again = Topology::from_toml("round-trip", &written)
            .unwrap_or_else(|e| panic!("{e}\n{written}"));
        assert_eq!(topology, again, "{name} does not round-trip");
    }
}

#[test]
fn job_examples_round_trip() {
    let files = files_in("examples", ".job.toml");
    assert!(files.len() >= 2, "expected job examples, found {files:?}");
    for path in files {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let job = JobSpec::from_toml(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let again = JobSpec::from_toml("round-trip", &job.to_toml().unwrap()).unwrap();
        assert_eq!(job, again, "{name} does not round-trip");
    }
}

#[test]
fn scenario_examples_round_trip_and_resolve() {
    let files = files_in("scenarios", ".toml");
    assert!(
        files.len() >= 4,
        "expected scenario examples, found {files:?}"
    );
    for path in files {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let scenario = Scenario::from_toml(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let again = Scenario::from_toml("round-trip", &scenario.to_toml().unwrap()).unwrap();
        assert_eq!(scenario, again, "{name} does not round-trip");
        // Its topology and job exist, parse, and agree with the scenario.
        let dir = path.parent().unwrap();
        let topology_path = dir.join(&scenario.topology);
        let topology = Topology::from_toml(
            &topology_path.display().to_string(),
            &std::fs::read_to_string(&topology_path).unwrap(),
        )
        .unwrap();
        let job_path = dir.join(&scenario.job);
        let job = JobSpec::from_toml(
            &job_path.display().to_string(),
            &std::fs::read_to_string(&job_path).unwrap(),
        )
        .unwrap();
        assert_eq!(scenario.violations_against(&topology), vec![], "{name}");
        assert_eq!(job.violations_against(&topology), vec![], "{name}");
    }
}
