//! The agent's TOML config under arbitrary text and mutations of the bundled agent configs: a
//! config that prints back to itself (`to_toml`), or an error whose every issue points inside
//! the file; never a panic. The edits are those of `coordinator/core/tests/config_inputs.rs`,
//! on the agent's files. The same target runs longer under cargo-fuzz (`fuzz/`).

use std::path::Path;

use proptest::prelude::*;

use super::AgentConfig;

const EXAMPLES: &[&str] = &[
    include_str!("../../deploy/agents/paris.toml"),
    include_str!("../../deploy/agents/frankfurt.toml"),
    include_str!("../../deploy/agents/virginia.toml"),
];

fn base() -> &'static Path {
    Path::new("/etc/longhaul")
}

fn check(text: &str) -> Result<(), TestCaseError> {
    match AgentConfig::from_toml("agent.toml", text, base()) {
        Ok(config) => {
            let printed = config
                .to_toml()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let again = AgentConfig::from_toml("agent.toml", &printed, base())
                .map_err(|e| TestCaseError::fail(format!("printed back:\n{printed}\n{e}")))?;
            prop_assert_eq!(again, config, "printed as:\n{}", printed);
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

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "\n",
            " ",
            "=",
            "[",
            "]",
            "{",
            "}",
            ",",
            ".",
            "\"",
            "#",
            "site",
            "coordinators",
            "plaintext",
            "true",
            "false",
            "data_listen",
            "status_listen",
            "state_dir",
            "[inventory]",
            "[render]",
            "[probe]",
            "[submit]",
            "[tls]",
            "source",
            "static",
            "\"127.0.0.1:0\"",
            "\"[::1]:99999\"",
            "\"http://\"",
            "\"ftp://x\"",
            "\"\"",
            "1e400",
            "-1",
            "18446744073709551616",
            "\"µ\"",
            "\u{0}",
        ])
        .prop_map(str::to_string),
        "[a-z_]{1,8}",
        "\"[^\"\\\\]{0,12}\"",
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

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
fn every_bundled_agent_config_parses_and_prints_back_equal() {
    for text in EXAMPLES {
        AgentConfig::from_toml("agent.toml", text, base()).unwrap_or_else(|e| panic!("{e}"));
        check(text).unwrap_or_else(|e| panic!("{e}"));
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn arbitrary_text_parses_to_an_agent_config_that_prints_back_or_to_located_issues(
        text in prop_oneof![any::<String>(), prop::collection::vec(token(), 0..60).prop_map(|t| t.concat())],
    ) {
        check(&text)?;
    }

    #[test]
    fn an_edited_agent_config_parses_to_one_that_prints_back_or_to_located_issues(text in mutated_example()) {
        check(&text)?;
    }
}
