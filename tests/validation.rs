//! Invalid config files, each with the exact field path and line its first
//! error must name.
//!
//! Each case edits a small valid base document (line numbers in the comments
//! of `TOPOLOGY`, `JOB` and `SCENARIO`), either by replacing one line's text
//! or by appending lines, so the expected line is easy to check by eye.

use longhaul_core::config::{ConfigError, Violation};
use longhaul_core::{JobSpec, Scenario, Topology};

const TOPOLOGY: &str = r#"name = "base"
[[sites]]
id = "a"
location = { latitude = 52.0, longitude = 5.0 }
[[sites.buildings]]
id = "b1"
fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s", oversubscription = 1.0 }
[[sites.buildings.domains]]
id = "rack"
count = 2
nodes_per_domain = 18
gpus_per_node = 4
gpu = "gb200"
[[sites]]
id = "b"
location = { latitude = 51.0, longitude = 5.0 }
[[sites.buildings]]
id = "b1"
fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s" }
[[sites.buildings.domains]]
id = "hgx"
nodes_per_domain = 1
gpus_per_node = 8
gpu = "h100"
[[links]]
between = ["a", "b"]
distance = "150 km"
parallel_links = 4
link_rate = "400 Gbit/s"
loss = 0.0001
"#;
// Line map of TOPOLOGY: 1 name, 2-13 site a (3 id, 4 location, 6 building id,
// 7 fabric, 9 domain id, 10 count, 11 nodes_per_domain, 12 gpus_per_node,
// 13 gpu), 14-24 site b (15 id, 16 location, 18 building id, 19 fabric,
// 21 domain id, 22 nodes_per_domain, 23 gpus_per_node, 24 gpu), 25-30 link
// (26 between, 27 distance, 28 parallel_links, 29 link_rate, 30 loss).

const JOB: &str = r#"name = "job"
[model]
parameters = 7_000_000_000
layers = 32
hidden_size = 4096
attention_heads = 32
sequence_length = 4096
[batch]
global_batch = 512
micro_batch = 2
[constraints]
max_tensor_parallel = 8
tensor_parallel = 8
"#;

const SCENARIO: &str = r#"name = "scenario"
seed = 1
topology = "topology.toml"
job = "job.toml"
duration = "30 s"
[coordinator]
replicas = 3
sites = ["a", "a", "b"]
[[timeline]]
at = "5 s"
action = "partition"
site = "b"
"#;

/// How a case changes its base document.
enum Edit {
    /// Replace the first occurrence of `from` with `to`.
    Replace(&'static str, &'static str),
    /// Apply several replacements in order.
    ReplaceEach(&'static [(&'static str, &'static str)]),
    /// Append lines at the end.
    Append(&'static str),
}

fn apply(base: &str, edit: &Edit) -> String {
    match edit {
        Edit::Replace(from, to) => {
            assert!(
                base.contains(from),
                "case edits text the base does not have: {from:?}"
            );
            base.replacen(from, to, 1)
        }
        Edit::ReplaceEach(pairs) => pairs.iter().fold(base.to_string(), |text, (from, to)| {
            apply(&text, &Edit::Replace(from, to))
        }),
        Edit::Append(text) => format!("{base}{text}"),
    }
}

/// Asserts that `result` failed with `path` at `line` as its first issue and
/// that the message contains `needle`.
fn check<T: std::fmt::Debug>(
    case: &str,
    result: Result<T, ConfigError>,
    path: &str,
    line: usize,
    needle: &str,
) {
    let error = match result {
        Ok(value) => panic!("case {case:?}: expected an error, got {value:?}"),
        Err(error) => error,
    };
    let first = error.first();
    assert_eq!(first.path, path, "case {case:?}: wrong path in\n{error}");
    assert_eq!(first.line, line, "case {case:?}: wrong line in\n{error}");
    assert!(first.column >= 1, "case {case:?}: no column in\n{error}");
    assert!(
        first.message.contains(needle),
        "case {case:?}: message {:?} lacks {needle:?}",
        first.message
    );
    // The rendered error names file, line and field, as users see it.
    let rendered = error.to_string();
    assert!(
        rendered.starts_with(&format!("{case}.toml:{line}:")),
        "case {case:?}: rendered as {rendered:?}"
    );
    assert!(
        rendered.contains(&format!("field `{path}`")),
        "case {case:?}: {rendered:?}"
    );
}

#[test]
fn the_base_documents_are_valid() {
    let topology = Topology::from_toml("base.toml", TOPOLOGY).unwrap_or_else(|e| panic!("{e}"));
    let job = JobSpec::from_toml("job.toml", JOB).unwrap_or_else(|e| panic!("{e}"));
    let scenario = Scenario::from_toml("scenario.toml", SCENARIO).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(job.violations_against(&topology), Vec::<Violation>::new());
    assert_eq!(
        scenario.violations_against(&topology),
        Vec::<Violation>::new()
    );
}

#[test]
fn invalid_topologies_name_field_and_line() {
    use Edit::*;
    let cases: &[(&str, Edit, &str, usize, &str)] = &[
        (
            "syntax",
            Replace("count = 2", "count = = 2"),
            "(document)",
            10,
            "invalid TOML",
        ),
        (
            "unknown-top-level-key",
            Replace("name = \"base\"\n", "name = \"base\"\ncolour = \"blue\"\n"),
            "colour",
            2,
            "unknown field `colour`",
        ),
        (
            "unknown-site-key",
            Replace("id = \"a\"\n", "id = \"a\"\nregion = \"eu\"\n"),
            "sites[0].region",
            4,
            "unknown field `region`",
        ),
        (
            "unknown-fabric-key",
            Replace(
                "oversubscription = 1.0 }",
                "oversubscription = 1.0, mtu = 9000 }",
            ),
            "sites[0].buildings[0].fabric.mtu",
            7,
            "unknown field `mtu`",
        ),
        (
            "missing-site-id",
            Replace("id = \"b\"\n", ""),
            "sites[1]",
            14,
            "missing field `id`",
        ),
        (
            "wrong-type",
            Replace("count = 2", "count = \"two\""),
            "sites[0].buildings[0].domains[0].count",
            10,
            "expected u32",
        ),
        (
            "distance-in-bytes",
            Replace("distance = \"150 km\"", "distance = \"150 GB\""),
            "links[0].distance",
            27,
            "measures a size in bytes",
        ),
        (
            "rate-in-km",
            Replace(
                "link_rate = \"400 Gbit/s\"\nloss",
                "link_rate = \"400 km\"\nloss",
            ),
            "links[0].link_rate",
            29,
            "measures a distance",
        ),
        (
            "rate-without-unit",
            Replace(
                "link_rate = \"400 Gbit/s\"\nloss",
                "link_rate = \"400\"\nloss",
            ),
            "links[0].link_rate",
            29,
            "expected a data rate",
        ),
        (
            "negative-distance",
            Replace("distance = \"150 km\"", "distance = \"-150 km\""),
            "links[0].distance",
            27,
            "must not be negative",
        ),
        (
            "zero-link-rate",
            Replace(
                "link_rate = \"400 Gbit/s\"\nloss",
                "link_rate = \"0 Gbit/s\"\nloss",
            ),
            "links[0].link_rate",
            29,
            "positive data rate",
        ),
        (
            "zero-parallel-links",
            Replace("parallel_links = 4", "parallel_links = 0"),
            "links[0].parallel_links",
            28,
            "at least 1 link",
        ),
        (
            "route-beyond-the-earth",
            Replace("distance = \"150 km\"", "distance = \"1e300 km\""),
            "links[0].distance",
            27,
            "longer than twice around the Earth",
        ),
        (
            "too-many-parallel-links",
            Replace("parallel_links = 4", "parallel_links = 1000000"),
            "links[0].parallel_links",
            28,
            "more than the 4096 allowed",
        ),
        (
            "link-faster-than-a-petabit",
            Replace(
                "link_rate = \"400 Gbit/s\"\nloss",
                "link_rate = \"2000 Tbit/s\"\nloss",
            ),
            "links[0].link_rate",
            29,
            "faster than the",
        ),
        (
            "too-many-domains",
            Replace("count = 2", "count = 4000000000"),
            "sites[0].buildings[0].domains[0].count",
            10,
            "more than the 1000000 allowed",
        ),
        (
            "too-many-gpus-in-all",
            Replace("count = 2", "count = 1000000"),
            "sites[0].buildings",
            5,
            "GPUs in all, more than the 10000000 allowed",
        ),
        (
            "zero-domains",
            Replace("count = 2", "count = 0"),
            "sites[0].buildings[0].domains[0].count",
            10,
            "at least 1 domain",
        ),
        (
            "zero-gpus-per-node",
            Replace("gpus_per_node = 8", "gpus_per_node = 0"),
            "sites[1].buildings[0].domains[0].gpus_per_node",
            23,
            "at least 1 GPU",
        ),
        (
            "negative-count",
            Replace("count = 2", "count = -2"),
            "sites[0].buildings[0].domains[0].count",
            10,
            "invalid value",
        ),
        (
            "oversubscription-below-one",
            Replace("oversubscription = 1.0 }", "oversubscription = 0.5 }"),
            "sites[0].buildings[0].fabric.oversubscription",
            7,
            "at least 1.0",
        ),
        (
            "zero-fabric-rate",
            Replace(
                "link_rate = \"400 Gbit/s\", oversubscription",
                "link_rate = \"0 bit/s\", oversubscription",
            ),
            "sites[0].buildings[0].fabric.link_rate",
            7,
            "positive data rate",
        ),
        (
            "loss-as-percent",
            Replace("loss = 0.0001", "loss = 1.5"),
            "links[0].loss",
            30,
            "write 1% as 0.01",
        ),
        (
            "duplicate-site",
            Replace("id = \"b\"\n", "id = \"a\"\n"),
            "sites[1].id",
            15,
            "duplicate site id \"a\"",
        ),
        (
            "duplicate-building",
            ReplaceEach(&[
                (
                    "id = \"b\"\n",
                    "id = \"b\"\ncampus_interconnect = \"1 Tbit/s\"\n",
                ),
                (
                    "[[links]]",
                    "[[sites.buildings]]\nid = \"b1\"\nfabric = { kind = \"leaf-spine\", link_rate = \"100 Gbit/s\" }\ndomains = [{ id = \"x\", nodes_per_domain = 1, gpus_per_node = 8, gpu = \"h100\" }]\n[[links]]",
                ),
            ]),
            "sites[1].buildings[1].id",
            27,
            "duplicate building id \"b1\"",
        ),
        (
            "campus-without-interconnect",
            Replace(
                "[[links]]",
                "[[sites.buildings]]\nid = \"b2\"\nfabric = { kind = \"leaf-spine\", link_rate = \"100 Gbit/s\" }\ndomains = [{ id = \"x\", nodes_per_domain = 1, gpus_per_node = 8, gpu = \"h100\" }]\n[[links]]",
            ),
            "sites[1].buildings",
            17,
            "no `campus_interconnect`",
        ),
        (
            "duplicate-domain",
            Replace(
                "[[links]]",
                "[[sites.buildings.domains]]\nid = \"hgx\"\nnodes_per_domain = 1\ngpus_per_node = 8\ngpu = \"h100\"\n[[links]]",
            ),
            "sites[1].buildings[0].domains[1].id",
            26,
            "duplicate domain group id \"hgx\"",
        ),
        (
            "link-to-unknown-site",
            Replace("between = [\"a\", \"b\"]", "between = [\"a\", \"c\"]"),
            "links[0].between[1]",
            26,
            "unknown site \"c\"",
        ),
        (
            "link-to-itself",
            Replace("between = [\"a\", \"b\"]", "between = [\"a\", \"a\"]"),
            "links[0].between",
            26,
            "two different sites",
        ),
        (
            "duplicate-link",
            Append(
                "[[links]]\nbetween = [\"b\", \"a\"]\ndistance = \"200 km\"\nlink_rate = \"100 Gbit/s\"\n",
            ),
            "links[1].between",
            32,
            "duplicate link",
        ),
        (
            "link-with-three-ends",
            Replace(
                "between = [\"a\", \"b\"]",
                "between = [\"a\", \"b\", \"a\"]",
            ),
            "links[0].between",
            26,
            "exactly two site ids, found 3",
        ),
        (
            "site-without-gpus",
            Append("[[sites]]\nid = \"empty\"\nbuildings = []\n"),
            "sites[2].buildings",
            33,
            "has no GPUs",
        ),
        (
            "building-without-domains",
            Append(
                "[[sites]]\nid = \"c\"\n[[sites.buildings]]\nid = \"x\"\nfabric = { kind = \"leaf-spine\", link_rate = \"100 Gbit/s\" }\ndomains = []\n",
            ),
            "sites[2].buildings[0].domains",
            36,
            "no scale-up domains",
        ),
        (
            "unknown-gpu",
            Replace("gpu = \"h100\"", "gpu = \"h900\""),
            "sites[1].buildings[0].domains[0].gpu",
            24,
            "unknown GPU type \"h900\"",
        ),
        (
            "domain-beyond-nvlink-reach",
            Replace("nodes_per_domain = 18", "nodes_per_domain = 36"),
            "sites[0].buildings[0].domains[0].nodes_per_domain",
            11,
            "exceeds the scale-up reach",
        ),
        (
            "hgx-domain-of-two-nodes",
            Replace("nodes_per_domain = 1\n", "nodes_per_domain = 2\n"),
            "sites[1].buildings[0].domains[0].nodes_per_domain",
            22,
            "16 GPUs exceeds",
        ),
        (
            "bad-id",
            Replace("id = \"rack\"", "id = \"Rack 1\""),
            "sites[0].buildings[0].domains[0].id",
            9,
            "invalid id \"Rack 1\"",
        ),
        (
            "latitude-out-of-range",
            Replace("latitude = 51.0", "latitude = 151.0"),
            "sites[1].location.latitude",
            16,
            "[-90, 90]",
        ),
        (
            "fibre-shorter-than-geodesic",
            Replace("distance = \"150 km\"", "distance = \"50 km\""),
            "links[0].distance",
            27,
            "shorter than the 111 km great-circle",
        ),
        (
            "unknown-fabric-kind",
            Replace("kind = \"leaf-spine\"", "kind = \"torus\""),
            "sites[1].buildings[0].fabric.kind",
            19,
            "unknown variant `torus`",
        ),
        (
            "zero-buffer",
            Replace("loss = 0.0001", "loss = 0.0001\nbuffer = \"0 MiB\""),
            "links[0].buffer",
            31,
            "positive size",
        ),
        (
            "fractional-bytes",
            Replace("loss = 0.0001", "loss = 0.0001\nbuffer = \"0.5 B\""),
            "links[0].buffer",
            31,
            "not a whole number of bytes",
        ),
        (
            "builtin-gpu-redeclared",
            Replace(
                "name = \"base\"\n",
                "name = \"base\"\ngpu_types = [{ name = \"h100\", hbm = \"80 GiB\", dense_bf16 = \"989 TFLOP/s\", scale_up = \"450 GB/s\", max_domain_gpus = 8 }]\n",
            ),
            "gpu_types[0].name",
            2,
            "is built in",
        ),
        (
            "sites-defined-twice",
            Replace("name = \"base\"\n", "name = \"base\"\nsites = []\n"),
            "(document)",
            3,
            "duplicate key",
        ),
    ];
    assert!(cases.len() >= 25);
    for (case, edit, path, line, needle) in cases {
        let text = apply(TOPOLOGY, edit);
        check(
            case,
            Topology::from_toml(&format!("{case}.toml"), &text),
            path,
            *line,
            needle,
        );
    }
}

#[test]
fn an_empty_site_list_is_refused() {
    let text = "name = \"empty\"\nsites = []\n";
    check(
        "empty",
        Topology::from_toml("empty.toml", text),
        "sites",
        2,
        "at least one site",
    );
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let text = apply(TOPOLOGY, &Edit::Replace("count = 2", "count = 0"));
    let text = text.replace("parallel_links = 4", "parallel_links = 0");
    let error = Topology::from_toml("two.toml", &text).unwrap_err();
    let lines: Vec<usize> = error.issues.iter().map(|issue| issue.line).collect();
    assert_eq!(lines, vec![10, 28], "{error}");
}

#[test]
fn invalid_jobs_name_field_and_line() {
    use Edit::*;
    let cases: &[(&str, Edit, &str, usize, &str)] = &[
        (
            "heads-do-not-divide-hidden",
            Replace("attention_heads = 32", "attention_heads = 30"),
            "model.hidden_size",
            5,
            "not divisible by 30",
        ),
        (
            "batch-not-multiple",
            Replace("global_batch = 512", "global_batch = 511"),
            "batch.global_batch",
            9,
            "not a multiple",
        ),
        (
            "tp-above-max",
            Replace("\ntensor_parallel = 8\n", "\ntensor_parallel = 16\n"),
            "constraints.tensor_parallel",
            13,
            "exceeds max_tensor_parallel",
        ),
        (
            "zero-layers",
            Replace("layers = 32", "layers = 0"),
            "model.layers",
            4,
            "at least 1",
        ),
        (
            "unknown-precision",
            Append("[training]\nprecision = \"fp4\"\n"),
            "training.precision",
            15,
            "unknown variant `fp4`",
        ),
        (
            "pp-above-layers",
            Append("pipeline_parallel = 64\n"),
            "constraints.pipeline_parallel",
            14,
            "exceeds the 32 layers",
        ),
        (
            "kv-heads-do-not-divide-heads",
            Replace("attention_heads = 32", "attention_heads = 32\nkv_heads = 6"),
            "model.kv_heads",
            7,
            "6 key-value heads do not divide the 32 attention heads",
        ),
        (
            "tp-splits-kv-heads",
            Replace("attention_heads = 32", "attention_heads = 32\nkv_heads = 4"),
            "constraints.tensor_parallel",
            14,
            "does not divide the 4 key-value heads",
        ),
        (
            "too-many-parameters",
            Replace(
                "parameters = 7_000_000_000",
                "parameters = 10_000_000_000_000_000",
            ),
            "model.parameters",
            3,
            "more than the 1000000000000000 allowed",
        ),
        (
            "sequence-too-long",
            Replace("sequence_length = 4096", "sequence_length = 4000000000"),
            "model.sequence_length",
            7,
            "tokens, more than",
        ),
        (
            "one-expert",
            Append("[model.moe]\nexperts = 1\ntop_k = 1\nactive_parameters = 1_000_000_000\n"),
            "model.moe.experts",
            15,
            "at least 2, found 1",
        ),
        (
            "top-k-all-experts",
            Append("[model.moe]\nexperts = 8\ntop_k = 8\nactive_parameters = 7_000_000_000\n"),
            "model.moe.top_k",
            16,
            "fewer than the 8 experts",
        ),
        (
            "all-parameters-active",
            Append("[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 7_000_000_000\n"),
            "model.moe.active_parameters",
            17,
            "fewer than the 7000000000 parameters",
        ),
        (
            "fewer-active-than-top-k-experts",
            Append("[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 1_000_000_000\n"),
            "model.moe.active_parameters",
            17,
            "less than top_k / experts = 2 / 8",
        ),
        (
            "active-below-embeddings-and-top-k",
            Replace(
                "sequence_length = 4096\n",
                "sequence_length = 4096\nvocabulary_size = 128000\n[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 2_000_000_000\n",
            ),
            "model.moe.active_parameters",
            12,
            "plus top_k / experts = 2 / 8",
        ),
        (
            "expert-parallel-not-dividing-data-parallel",
            Append(
                "expert_parallel = 4\ndata_parallel = 2\n[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 2_000_000_000\n",
            ),
            "constraints.expert_parallel",
            14,
            "does not divide data_parallel 2",
        ),
        (
            "expert-parallel-not-dividing-micro-batches",
            Append(
                "expert_parallel = 3\n[model.moe]\nexperts = 24\ntop_k = 2\nactive_parameters = 2_000_000_000\n",
            ),
            "constraints.expert_parallel",
            14,
            "does not divide the 256 micro-batches",
        ),
        (
            "too-many-experts",
            Append(
                "[model.moe]\nexperts = 100_000\ntop_k = 2\nactive_parameters = 2_000_000_000\n",
            ),
            "model.moe.experts",
            15,
            "more than the 65536 allowed",
        ),
        (
            "unknown-moe-key",
            Append(
                "[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 2_000_000_000\nshared_experts = 1\n",
            ),
            "model.moe.shared_experts",
            18,
            "unknown field `shared_experts`",
        ),
        (
            "expert-parallel-on-a-dense-model",
            Append("expert_parallel = 4\n"),
            "constraints.expert_parallel",
            14,
            "needs a mixture-of-experts model",
        ),
        (
            "expert-parallel-not-dividing-experts",
            Append(concat!(
                "expert_parallel = 3\n",
                "[model.moe]\nexperts = 8\ntop_k = 2\nactive_parameters = 2_000_000_000\n"
            )),
            "constraints.expert_parallel",
            14,
            "does not divide the 8 experts",
        ),
        (
            "unknown-model-key",
            Replace("layers = 32", "layers = 32\nexperts = 8"),
            "model.experts",
            5,
            "unknown field `experts`",
        ),
    ];
    for (case, edit, path, line, needle) in cases {
        let text = apply(JOB, edit);
        check(
            case,
            JobSpec::from_toml(&format!("{case}.toml"), &text),
            path,
            *line,
            needle,
        );
    }
}

#[test]
fn a_job_is_checked_against_its_topology() {
    let topology = Topology::from_toml("base.toml", TOPOLOGY).unwrap();
    let text = JOB.replace(
        "max_tensor_parallel = 8\ntensor_parallel = 8",
        "max_tensor_parallel = 16\ntensor_parallel = 16",
    ) + "allowed_sites = [\"b\", \"z\"]\n";
    let job = JobSpec::from_toml("job.toml", &text).unwrap();
    let error =
        longhaul_core::config::violations_in("job.toml", &text, job.violations_against(&topology));
    let found: Vec<(&str, usize)> = error
        .issues
        .iter()
        .map(|i| (i.path.as_str(), i.line))
        .collect();
    assert_eq!(
        found,
        vec![
            ("constraints.tensor_parallel", 13),
            ("constraints.allowed_sites[1]", 14)
        ],
        "{error}"
    );
    assert!(
        error.issues[0]
            .message
            .contains("largest allowed domain has 8 GPUs"),
        "{error}"
    );
}

#[test]
fn invalid_scenarios_name_field_and_line() {
    use Edit::*;
    let cases: &[(&str, Edit, &str, usize, &str)] = &[
        (
            "partition-without-site",
            Replace("site = \"b\"\n", ""),
            "timeline[0]",
            9,
            "needs `site`",
        ),
        (
            "four-replicas",
            Replace("replicas = 3", "replicas = 4"),
            "coordinator.replicas",
            7,
            "1, 3 or 5",
        ),
        (
            "event-after-end",
            Replace("at = \"5 s\"", "at = \"50 s\""),
            "timeline[0].at",
            10,
            "after the scenario ends",
        ),
        (
            "unknown-action",
            Replace("action = \"partition\"", "action = \"explode\""),
            "timeline[0].action",
            11,
            "unknown variant `explode`",
        ),
        (
            "duration-in-km",
            Replace("duration = \"30 s\"", "duration = \"30 km\""),
            "duration",
            5,
            "measures a distance",
        ),
        (
            "no-connections",
            Append("[exchange]\nconnections = 0\n"),
            "exchange.connections",
            14,
            "between 1 and 64",
        ),
        (
            "too-many-connections",
            Append("[exchange]\nconnections = 65\n"),
            "exchange.connections",
            14,
            "is 65",
        ),
    ];
    for (case, edit, path, line, needle) in cases {
        let text = apply(SCENARIO, edit);
        check(
            case,
            Scenario::from_toml(&format!("{case}.toml"), &text),
            path,
            *line,
            needle,
        );
    }
}

#[test]
fn a_scenario_is_checked_against_its_topology() {
    let topology = Topology::from_toml("base.toml", TOPOLOGY).unwrap();
    let text = SCENARIO.replace("site = \"b\"", "site = \"z\"");
    let scenario = Scenario::from_toml("scenario.toml", &text).unwrap();
    let error = longhaul_core::config::violations_in(
        "scenario.toml",
        &text,
        scenario.violations_against(&topology),
    );
    assert_eq!(
        (error.first().path.as_str(), error.first().line),
        ("timeline[0].site", 12),
        "{error}"
    );
}
