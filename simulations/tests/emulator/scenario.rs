//! Building an emulator from a scenario: links, impairments, seeds.

use longhaul_core::{Scenario, Topology};
use longhaul_simulations::emulator::{Emulator, EmulatorError, direction_seed, scenario_links};
use longhaul_simulations::link::{JitterMode, LossModel};

fn lossy_long_haul() -> (Topology, Scenario) {
    let topology = Topology::from_toml(
        "three-sites-two-continents.toml",
        include_str!("../../../deploy/examples/three-sites-two-continents.toml"),
    )
    .unwrap();
    let scenario = Scenario::from_toml(
        "lossy-long-haul.toml",
        include_str!("../../../deploy/scenarios/lossy-long-haul.toml"),
    )
    .unwrap();
    (topology, scenario)
}

#[test]
fn every_wan_link_is_emulated_with_the_scenarios_impairments() {
    let (topology, scenario) = lossy_long_haul();
    let specs = scenario_links(&topology, Some(&scenario));
    assert_eq!(specs.len(), topology.links.len());
    let impaired = specs
        .iter()
        .find(|s| {
            s.sites.contains(&"paris".to_string()) && s.sites.contains(&"virginia".to_string())
        })
        .unwrap();
    assert_eq!(impaired.forward.loss, LossModel::Bernoulli { p: 0.005 });
    let jitter = impaired.forward.jitter.unwrap();
    assert_eq!(jitter.max.as_nanos(), 2_000_000);
    assert_eq!(jitter.mode, JitterMode::Fifo);
    // Without the scenario, the topology's own figures.
    let plain = scenario_links(&topology, None);
    assert!(plain.iter().all(|s| s.forward.jitter.is_none()));
}

#[tokio::test]
async fn seeds_derive_from_the_emulator_seed_and_the_direction_name() {
    let (topology, scenario) = lossy_long_haul();
    let emulator = Emulator::new(31, scenario_links(&topology, Some(&scenario))).unwrap();
    let statuses = emulator.statuses();
    assert_eq!(statuses.len(), 2 * topology.links.len());
    for status in &statuses {
        assert_eq!(status.seed, direction_seed(31, &status.from, &status.to));
    }
    assert_ne!(direction_seed(31, "a", "b"), direction_seed(31, "b", "a"));
    assert_ne!(direction_seed(31, "a", "b"), direction_seed(32, "a", "b"));
    // Another emulator with the same seed gets the same seeds.
    let again = Emulator::new(31, scenario_links(&topology, Some(&scenario))).unwrap();
    let seeds = |e: &Emulator| e.statuses().iter().map(|s| s.seed).collect::<Vec<_>>();
    assert_eq!(seeds(&emulator), seeds(&again));
}

#[test]
fn unknown_sites_and_links_are_named() {
    let (topology, _) = lossy_long_haul();
    let emulator = Emulator::new(1, scenario_links(&topology, None)).unwrap();
    let error = emulator.pipe("paris", "mars").unwrap_err();
    assert!(
        matches!(error, EmulatorError::UnknownLink { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("\"mars\""), "{error}");
    let error = emulator.set_down("mars", None, true).unwrap_err();
    assert!(
        matches!(error, EmulatorError::UnknownSite { .. }),
        "{error}"
    );
    // Cutting a site cuts both directions of each of its links.
    let cut = emulator.set_down("virginia", None, true).unwrap();
    assert_eq!(cut.len(), 4, "{cut:?}");
    assert!(emulator.statuses().iter().filter(|s| s.down).count() == 4);
}
