//! The TOML configs an operator writes, the input read as each of them: topology, job,
//! scenario, site agent. A config that prints back (`to_toml`) to an equal one, or an error
//! whose every issue points inside the text; never a panic. Seed it with the bundled configs:
//! `cargo +nightly fuzz run config_toml fuzz/corpus/config_toml deploy/examples
//! deploy/scenarios deploy/agents`.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_core::config::ConfigError;
use longhaul_core::job::JobSpec;
use longhaul_core::scenario::Scenario;
use longhaul_core::topology::Topology;
use longhaul_site_agent::config::AgentConfig;

fn located(text: &str, error: &ConfigError) {
    assert!(!error.issues.is_empty());
    let lines: Vec<&str> = text.split('\n').collect();
    for issue in &error.issues {
        if issue.line == 0 {
            assert_eq!(issue.column, 0, "{error}");
            continue;
        }
        assert!(issue.line <= lines.len(), "{error}");
        let width = lines[issue.line - 1].chars().count();
        assert!(issue.column >= 1 && issue.column <= width + 1, "{error}");
    }
}

macro_rules! check {
    ($text:expr, $parse:expr, $print:expr) => {
        match $parse($text) {
            Ok(value) => {
                let printed = $print(&value).expect("a parsed config prints");
                let again = $parse(&printed).unwrap_or_else(|e| panic!("printed:\n{printed}\n{e}"));
                assert_eq!(again, value, "printed:\n{printed}");
            }
            Err(error) => located($text, &error),
        }
    };
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    check!(
        text,
        |t| Topology::from_toml("fuzz.toml", t),
        Topology::to_toml
    );
    check!(
        text,
        |t| JobSpec::from_toml("fuzz.toml", t),
        JobSpec::to_toml
    );
    check!(
        text,
        |t| Scenario::from_toml("fuzz.toml", t),
        Scenario::to_toml
    );
    check!(
        text,
        |t| AgentConfig::from_toml("fuzz.toml", t, Path::new("/etc/longhaul")),
        AgentConfig::to_toml
    );
});
