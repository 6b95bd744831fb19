//! The agent config's parsing and validation: defaults, every field's
//! refusal naming the field, and the options each section gives.

use super::*;
use crate::probe::QuicController;

const GOOD: &str = r#"
site = "north"
coordinators = ["http://127.0.0.1:7700", "http://127.0.0.1:7701"]
plaintext = true

[inventory]
source = "static"
site = "north"
static = { file = "topology.toml" }
"#;

#[test]
fn a_good_config_parses_with_defaults_and_resolved_paths() {
    let config = AgentConfig::from_toml("agent.toml", GOOD, Path::new("/etc/longhaul")).unwrap();
    assert_eq!(config.data_listen.to_string(), DEFAULT_DATA_LISTEN);
    assert_eq!(config.status_listen.to_string(), DEFAULT_STATUS_LISTEN);
    assert_eq!(config.state_dir(), PathBuf::from(".longhaul-agent/north"));
    assert_eq!(
        config.inventory.static_file.as_ref().unwrap().file,
        PathBuf::from("/etc/longhaul/topology.toml")
    );
}

#[test]
fn relative_paths_are_cleaned_lexically() {
    assert_eq!(
        lexically_clean(Path::new("deploy/agents/../../.data/./x")),
        PathBuf::from(".data/x")
    );
    assert_eq!(
        lexically_clean(Path::new("../a/../b")),
        PathBuf::from("../b")
    );
    assert_eq!(
        lexically_clean(Path::new("/a/b/../c")),
        PathBuf::from("/a/c")
    );
}

#[test]
fn every_bad_setting_is_named_with_its_line() {
    let bad = r#"
site = "North!"
coordinators = ["https://127.0.0.1:7700", "http://127.0.0.1:99999", "ftp://c:1"]
call_timeout = "0 s"

[inventory]
source = "static"
site = "south"
static = { file = "topology.toml" }
"#;
    let error = AgentConfig::from_toml("agent.toml", bad, Path::new(".")).unwrap_err();
    let text = error.to_string();
    for expected in [
        "agent.toml:2:8: field `site`",
        "field `inventory.site`: is \"south\" but the agent is for site \"North!\"",
        "field `coordinators[0]`: \"https://127.0.0.1:7700\" must start with http://",
        "field `coordinators[1]`: ",
        "port",
        "field `coordinators[2]`: scheme \"ftp\" is not http or https",
        "field `tls`: is missing",
        "field `call_timeout`: must be at least 1 ms",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let unknown = AgentConfig::from_toml(
        "agent.toml",
        &GOOD.replace("plaintext = true", "plaintext = true\nlease = 3"),
        Path::new("."),
    )
    .unwrap_err();
    assert!(unknown.to_string().contains("lease"), "{unknown}");
}

#[test]
fn a_socket_buffer_outside_its_bounds_is_named() {
    for (size, accepted) in [("1 KiB", false), ("2 GiB", false), ("8 MiB", true)] {
        let text = format!("{GOOD}\n[probe]\nsocket_buffer = \"{size}\"\n");
        let parsed = AgentConfig::from_toml("agent.toml", &text, Path::new("."));
        match parsed {
            Ok(config) => {
                assert!(accepted, "{size} was accepted");
                let options = config.probe.scheduler_options();
                assert_eq!(options.probe.transport.socket_buffer_bytes, 8 << 20);
            }
            Err(error) => {
                assert!(!accepted, "{size}: {error}");
                assert!(
                    error
                        .to_string()
                        .contains("field `probe.socket_buffer`: is "),
                    "{error}"
                );
            }
        }
    }
}

#[test]
fn bad_trainer_settings_are_named() {
    for (section, expected) in [
        ("shm_dir = \"/dev/shm\"", "trainer.socket"),
        ("listen = \"0.0.0.0:7950\"", "trainer.listen"),
        (
            "socket = \"t.sock\"\nsession_ttl = \"10 ms\"",
            "trainer.session_ttl",
        ),
    ] {
        let text = format!("{GOOD}\n[trainer]\n{section}\n");
        let error = AgentConfig::from_toml("agent.toml", &text, Path::new("/etc/lh")).unwrap_err();
        assert!(error.to_string().contains(expected), "{section}: {error}");
    }
    let both =
        format!("{GOOD}\n[exchange]\nsynthetic_elements = 10\n[trainer]\nsocket = \"t.sock\"\n");
    let error = AgentConfig::from_toml("agent.toml", &both, Path::new("/etc/lh")).unwrap_err();
    assert!(
        error.to_string().contains("exchange.synthetic_elements"),
        "{error}"
    );
    let good = format!("{GOOD}\n[trainer]\nsocket = \"run/t.sock\"\nlisten = \"127.0.0.1:7950\"\n");
    let config = AgentConfig::from_toml("agent.toml", &good, Path::new("/etc/lh")).unwrap();
    let trainer = config.trainer.clone().unwrap();
    assert_eq!(trainer.socket, Some(PathBuf::from("/etc/lh/run/t.sock")));
    assert_eq!(trainer.shm_dir, PathBuf::from("/dev/shm"));
    assert_eq!(trainer.session_ttl, Duration::from_secs(30));
    let again =
        AgentConfig::from_toml("agent.toml", &config.to_toml().unwrap(), Path::new("/x")).unwrap();
    assert_eq!(again, config);
}

#[test]
fn bad_exchange_settings_are_named() {
    for (setting, field) in [
        ("synthetic_elements = 0", "exchange.synthetic_elements"),
        (
            "synthetic_elements = 300_000_000",
            "exchange.synthetic_elements",
        ),
        ("connections_per_peer = 0", "exchange.connections_per_peer"),
        ("connections_per_peer = 65", "exchange.connections_per_peer"),
        ("link_rate = \"100 kbit/s\"", "exchange.link_rate"),
        ("pacing = \"1 kbit/s\"", "exchange.pacing"),
        ("peer_timeout = \"0 s\"", "exchange.peer_timeout"),
        ("congestion = \"vegas\"", "exchange.congestion"),
    ] {
        let text = format!("{GOOD}\n[exchange]\n{setting}\n");
        let error = AgentConfig::from_toml("agent.toml", &text, Path::new("."))
            .expect_err(setting)
            .to_string();
        assert!(
            error.contains(&format!("field `{field}`")),
            "{setting}: {error}"
        );
    }
    let text = format!("{GOOD}\n[exchange]\nsynthetic_elements = 4096\nlink_rtt = \"70 ms\"\n");
    let config = AgentConfig::from_toml("agent.toml", &text, Path::new(".")).unwrap();
    assert_eq!(config.exchange.synthetic_elements, Some(4096));
    assert_eq!(
        config.exchange.options().link_rtt,
        std::time::Duration::from_millis(70)
    );
    assert_eq!(
        config.exchange.options().congestion,
        crate::exchange::Congestion::Cubic
    );
    let text = format!("{GOOD}\n[exchange]\ncongestion = \"dedicated\"\n");
    let config = AgentConfig::from_toml("agent.toml", &text, Path::new(".")).unwrap();
    let tuning = config.exchange.options().tuning();
    // 1.25 × BDP (1 Gbit/s × 50 ms = 6.25 MB) over 4 connections.
    assert_eq!(
        tuning.controller,
        QuicController::Dedicated { window: 1_953_125 }
    );
    for (name, controller) in [
        ("cubic", QuicController::Cubic),
        ("new-reno", QuicController::NewReno),
        ("bbr", QuicController::Bbr),
    ] {
        let text = format!("{GOOD}\n[exchange]\ncongestion = \"{name}\"\n");
        let config = AgentConfig::from_toml("agent.toml", &text, Path::new(".")).unwrap();
        let tuning = config.exchange.options().tuning();
        assert_eq!(tuning.controller, controller, "{name}");
    }
    let text = format!("{GOOD}\n[exchange]\ncongestion = \"reno\"\n");
    let error = AgentConfig::from_toml("agent.toml", &text, Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("congestion") && error.contains("new-reno"),
        "{error}"
    );
}

/// A config with every field and section set to something other than
/// its default, valid as a whole, with absolute paths (which parsing
/// leaves as they are).
fn everything_set() -> AgentConfig {
    use crate::inventory::{BuildingConfig, SlurmConfig};
    use crate::render::{SlurmTopology, Target};
    use longhaul_core::topology::{Fabric, FabricKind, Location};

    let fabric = |kind, oversubscription| Fabric {
        kind,
        link_rate: DataRate::from_gbit_per_second(400),
        oversubscription,
    };
    let mut inventory = InventoryConfig::slurm(
        "north",
        fabric(FabricKind::RailAligned, 1.0),
        SlurmConfig {
            scontrol: "/opt/slurm/bin/scontrol".into(),
            timeout: Duration::from_secs(10),
            nodes_json: Some("/srv/north/nodes.json".into()),
            nodes_text: None,
            topology_file: Some("/srv/north/topology.conf".into()),
            partitions: vec!["gpu".into(), "large".into()],
            buildings: [("dh1".into(), "block[1-8]".into())].into(),
            default_building: Some("dh2".into()),
            untyped_gpu: Some("h100".into()),
        },
    );
    inventory.site_name = Some("North campus".into());
    inventory.location = Some(Location {
        latitude: 52.52,
        longitude: 13.405,
    });
    inventory.campus_interconnect = Some(DataRate::from_gbit_per_second(25_600));
    inventory.buildings = [(
        "dh2".into(),
        BuildingConfig {
            fabric: fabric(FabricKind::LeafSpine, 2.0),
        },
    )]
    .into();
    inventory.gpu_aliases = [("tesla_h100".into(), "h100".into())].into();

    let mut render = RenderOptions {
        command: "python -u pretrain.py --config run.yaml".into(),
        targets: vec![Target::Slurm, Target::Kubernetes],
        rendezvous_port: 29600,
        ..RenderOptions::default()
    };
    render.slurm.partition = Some("gpu".into());
    render.slurm.account = Some("ml".into());
    render.slurm.time_limit = Some("1-12:00:00".into());
    render.slurm.topology = SlurmTopology::Block;
    render.slurm.exclusive = false;
    render.kubernetes.namespace = "training".into();
    render.kubernetes.queue_name = Some("gpu-queue".into());
    render.kubernetes.image = Some("registry.example/trainer:1".into());
    render.kubernetes.domain_label = "example.com/rack".into();
    render.kubernetes.block_label = Some("example.com/block".into());
    render.kubernetes.gpu_resource = "example.com/gpu".into();

    let address = |port| SocketAddr::from(([10, 1, 0, 5], port));
    AgentConfig {
        tls: Some(TlsFiles {
            ca: "/etc/longhaul/ca.pem".into(),
            cert: "/etc/longhaul/north.pem".into(),
            key: "/etc/longhaul/north.key".into(),
        }),
        data_advertise: Some(SocketAddr::from(([192, 0, 2, 7], 7800))),
        metrics_listen: Some(address(9800)),
        state_dir: Some("/var/lib/longhaul-agent".into()),
        rescan_interval: Duration::from_secs(45),
        call_timeout: Duration::from_millis(1500),
        render,
        submit: Some(SubmitConfig {
            sbatch: "/opt/slurm/bin/sbatch".into(),
            args: vec!["--hold".into()],
            timeout: Duration::from_secs(20),
        }),
        probe: ProbeConfig {
            enabled: false,
            interval: Duration::from_secs(15),
            pings: 7,
            loss_datagrams: 0,
            throughput_duration: Duration::from_millis(2500),
            throughput_streams: 4,
            seed: 42,
            socket_buffer: ByteSize::from_bytes(64 << 20),
            peer_addresses: [
                ("south".into(), SocketAddr::from(([127, 0, 0, 1], 17801))),
                ("east-2".into(), SocketAddr::from(([127, 0, 0, 1], 17802))),
            ]
            .into(),
        },
        exchange: ExchangeConfig {
            synthetic_elements: Some(1 << 20),
            seed: 9,
            connections_per_peer: 8,
            link_rate: DataRate::from_gbit_per_second(10),
            link_rtt: Duration::from_millis(70),
            pacing: Some(DataRate::from_gbit_per_second(2)),
            peer_timeout: Duration::from_secs(30),
            congestion: crate::exchange::Congestion::Dedicated,
        },
        ..AgentConfig::new(
            "north",
            vec![
                "https://10.0.0.1:7700".into(),
                "https://10.0.0.2:7700".into(),
            ],
            address(7800),
            address(7900),
            inventory,
        )
    }
}

#[test]
fn a_config_with_every_section_set_is_read_back_equal() {
    let config = everything_set();
    let text = config.to_toml().unwrap();
    let parsed = AgentConfig::from_toml("written.toml", &text, Path::new("/elsewhere"))
        .unwrap_or_else(|e| panic!("{e}\nin:\n{text}"));
    assert_eq!(parsed, config, "in:\n{text}");
    for section in ["[tls]", "[inventory]", "[render]", "[submit]", "[probe]"] {
        assert!(text.contains(section), "no {section} in:\n{text}");
    }
}

#[test]
fn the_constructor_has_the_parsers_defaults_and_writes_only_what_is_set() {
    let config = AgentConfig {
        plaintext: true,
        ..AgentConfig::new(
            "north",
            vec![
                "http://127.0.0.1:7700".into(),
                "http://127.0.0.1:7701".into(),
            ],
            DEFAULT_DATA_LISTEN.parse().unwrap(),
            DEFAULT_STATUS_LISTEN.parse().unwrap(),
            InventoryConfig::static_file("north", "/etc/longhaul/topology.toml"),
        )
    };
    let parsed = AgentConfig::from_toml("agent.toml", GOOD, Path::new("/etc/longhaul")).unwrap();
    assert_eq!(config, parsed);
    let text = config.to_toml().unwrap();
    for absent in ["tls", "render", "probe", "submit", "state_dir"] {
        assert!(!text.contains(absent), "{absent} written in:\n{text}");
    }
    let again = AgentConfig::from_toml("written.toml", &text, Path::new("/elsewhere")).unwrap();
    assert_eq!(again, config);
}

#[test]
fn the_bundled_agent_configs_are_read_back_equal_when_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agents");
    let dir = dir.canonicalize().unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        // Paths come out resolved against the (absolute) directory, so
        // reading the written file there again changes nothing.
        let config = AgentConfig::from_toml(&name, &text, &dir).unwrap();
        let written = config.to_toml().unwrap();
        let again = AgentConfig::from_toml(&name, &written, &dir)
            .unwrap_or_else(|e| panic!("{e}\nin:\n{written}"));
        assert_eq!(again, config, "{name}, written as:\n{written}");
        seen += 1;
    }
    assert!(seen >= 3, "only {seen} configs in {}", dir.display());
}

#[test]
fn a_written_config_is_still_checked_when_read() {
    let mut config = everything_set();
    config.plaintext = true;
    let error = AgentConfig::from_toml("written.toml", &config.to_toml().unwrap(), Path::new("/"))
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("field `plaintext`: is true but [tls] is set too"),
        "{error}"
    );
}
