//! The TOML configs an operator writes (topology, job, scenario) under arbitrary text and
//! mutations of the bundled examples: a value that prints back to itself, or an error whose
//! every issue points inside the file; never a panic. The same targets run longer under
//! cargo-fuzz (`fuzz/`).

use std::fmt::Debug;

use longhaul_core::config::ConfigError;
use longhaul_core::job::JobSpec;
use longhaul_core::scenario::Scenario;
use longhaul_core::topology::Topology;
use proptest::prelude::*;

/// A config file format: parsed with its file name, printed back.
trait Config: Sized + PartialEq + Debug {
    fn parse(text: &str) -> Result<Self, ConfigError>;
    fn print(&self) -> Result<String, String>;
}

macro_rules! config {
    ($($t:ty),*) => {$(
        impl Config for $t {
            fn parse(text: &str) -> Result<Self, ConfigError> {
                <$t>::from_toml("input.toml", text)
            }
            fn print(&self) -> Result<String, String> {
                self.to_toml().map_err(|e| e.to_string())
            }
        }
    )*};
}
config!(Topology, JobSpec, Scenario);

const EXAMPLES: &[&str] = &[
    include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    include_str!("../../../deploy/examples/two-campuses-500km.toml"),
    include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
    include_str!("../../../deploy/examples/hyperscale-plus-two.toml"),
    include_str!("../../../deploy/examples/llama-70b.job.toml"),
    include_str!("../../../deploy/examples/dense-400b.job.toml"),
    include_str!("../../../deploy/scenarios/quick-failover.toml"),
    include_str!("../../../deploy/scenarios/lossy-long-haul.toml"),
    include_str!("../../../deploy/scenarios/three-sites-continents.toml"),
    include_str!("../../../deploy/scenarios/quick-exchange.toml"),
    include_str!("../../../deploy/examples/llama-70b-diloco.job.toml"),
];

/// What any text must give: a value that prints to TOML parsing back equal, or an error with
/// at least one issue, each at a line and column of the text (or at none: 0, 0).
fn check<C: Config>(text: &str) -> Result<(), TestCaseError> {
    match C::parse(text) {
        Ok(value) => {
            let printed = value.print().map_err(TestCaseError::fail)?;
            let again = C::parse(&printed)
                .map_err(|e| TestCaseError::fail(format!("printed back:\n{printed}\n{e}")))?;
            prop_assert_eq!(again, value, "printed as:\n{}", printed);
        }
        Err(error) => {
            prop_assert!(!error.issues.is_empty());
            let lines: Vec<&str> = text.split('\n').collect();
            for issue in &error.issues {
                if issue.line == 0 {
                    prop_assert_eq!(issue.column, 0, "{}", error);
                    continue;
                }
                prop_assert!(issue.line <= lines.len(), "{}", error);
                let width = lines[issue.line - 1].chars().count();
                prop_assert!(issue.column >= 1 && issue.column <= width + 1, "{}", error);
            }
        }
    }
    Ok(())
}

fn check_all(text: &str) -> Result<(), TestCaseError> {
    check::<Topology>(text)?;
    check::<JobSpec>(text)?;
    check::<Scenario>(text)
}

/// Pieces of TOML and of these configs, so that random text is often nearly valid.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "\n",
            " ",
            "=",
            "[",
            "]",
            "[[",
            "]]",
            "{",
            "}",
            ",",
            ".",
            "\"",
            "'",
            "#",
            "\\",
            "\"\"\"",
            "name",
            "sites",
            "id",
            "buildings",
            "links",
            "between",
            "gpus",
            "model",
            "timeline",
            "at",
            "action",
            "coordinator",
            "replicas",
            "1",
            "0",
            "-1",
            "1e400",
            "nan",
            "inf",
            "-0.0",
            "18446744073709551616",
            "true",
            "\"1 s\"",
            "\"80 km\"",
            "\"400 Gbit/s\"",
            "\"µs\"",
            "\u{0}",
            "\u{feff}",
            "ß",
        ])
        .prop_map(str::to_string),
        "[a-z_]{1,8}",
        "\"[^\"\\\\]{0,12}\"",
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

fn toml_like() -> impl Strategy<Value = String> {
    prop::collection::vec(token(), 0..60).prop_map(|tokens| tokens.concat())
}

/// One edit of an example: cut a stretch, insert text, duplicate or drop a line, swap two
/// lines, or replace a line's value.
fn mutated_example() -> impl Strategy<Value = String> {
    (
        prop::sample::select(EXAMPLES.to_vec()),
        0..6u8,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        token(),
    )
        .prop_map(|(example, edit, a, b, token)| {
            let mut lines: Vec<String> = example.lines().map(str::to_string).collect();
            let (i, j) = (a.index(lines.len()), b.index(lines.len()));
            match edit {
                0 => {
                    let chars: Vec<char> = example.chars().collect();
                    let (from, to) = (a.index(chars.len()), b.index(chars.len()));
                    let (from, to) = (from.min(to), from.max(to));
                    return chars[..from].iter().chain(&chars[to..]).collect();
                }
                1 => {
                    let at = example
                        .char_indices()
                        .nth(a.index(example.chars().count()))
                        .map_or(0, |(at, _)| at);
                    return format!("{}{token}{}", &example[..at], &example[at..]);
                }
                2 => {
                    let line = lines[i].clone();
                    lines.insert(j, line);
                }
                3 => {
                    lines.remove(i);
                }
                4 => lines.swap(i, j),
                _ => {
                    if let Some((key, _)) = lines[i].split_once('=') {
                        lines[i] = format!("{key}= {token}");
                    }
                }
            }
            lines.join("\n")
        })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn every_bundled_example_parses_and_prints_back_equal() {
    let parsed: usize = EXAMPLES
        .iter()
        .map(|text| {
            usize::from(Topology::parse(text).is_ok())
                + usize::from(JobSpec::parse(text).is_ok())
                + usize::from(Scenario::parse(text).is_ok())
        })
        .sum();
    assert_eq!(parsed, EXAMPLES.len(), "each example is one kind of config");
    for text in EXAMPLES {
        check_all(text).unwrap();
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn arbitrary_text_parses_to_a_config_that_prints_back_or_to_located_issues(text in any::<String>()) {
        check_all(&text)?;
    }

    #[test]
    fn toml_like_text_parses_to_a_config_that_prints_back_or_to_located_issues(text in toml_like()) {
        check_all(&text)?;
    }

    #[test]
    fn an_edited_example_parses_to_a_config_that_prints_back_or_to_located_issues(text in mutated_example()) {
        check_all(&text)?;
    }
}

/// A file that passes its check is never refused later for its size: the bounds that
/// admission puts on a replicated write are checked when the file is read, naming the field.
#[test]
fn a_file_holding_more_than_a_replicated_write_may_is_refused_when_read() {
    let mut topology = Topology::from_toml("t.toml", EXAMPLES[0]).unwrap();
    topology.sites[0].name = Some("n".repeat(longhaul_core::limits::MAX_NAME_LEN + 1));
    let text = topology.to_toml().unwrap();
    let error = Topology::from_toml("t.toml", &text).unwrap_err();
    assert!(
        error.issues.iter().any(|i| i.path == "sites[0].name"),
        "{error}"
    );

    let mut topology = Topology::from_toml("t.toml", EXAMPLES[0]).unwrap();
    let building = topology.sites[1].buildings[0].clone();
    topology.sites[1].buildings = (0..=longhaul_core::limits::MAX_BUILDINGS_PER_SITE)
        .map(|b| longhaul_core::topology::Building {
            id: format!("b{b}"),
            ..building.clone()
        })
        .collect();
    let text = topology.to_toml().unwrap();
    let error = Topology::from_toml("t.toml", &text).unwrap_err();
    assert!(
        error.issues.iter().any(|i| i.path == "sites[1].buildings"),
        "{error}"
    );

    let mut job = JobSpec::from_toml("j.toml", EXAMPLES[4]).unwrap();
    job.constraints.allowed_sites = (0..=longhaul_core::limits::MAX_SITES)
        .map(|i| format!("s{i}"))
        .collect();
    let text = job.to_toml().unwrap();
    let error = JobSpec::from_toml("j.toml", &text).unwrap_err();
    assert!(
        error
            .issues
            .iter()
            .any(|i| i.path == "constraints.allowed_sites" && i.message.contains("allowed")),
        "{error}"
    );
}
