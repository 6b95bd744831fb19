//! Seeds: the same seed replays a run bit for bit, another one differs.

use longhaul_simulations::des::{ExchangeConfig, SenderModel, exchange};

use crate::{link, run, test_seed};

/// Two runs of a lossy Reno transfer with the same seed give equal reports
/// (every counter, every time, the goodput's bits); a different seed gives
/// a different one.
#[test]
fn the_same_seed_replays_a_transfer_and_another_seed_differs() {
    let seed = test_seed(61);
    let first = run(link(200, 20.0, 1e-2), 5_000_000, 4, SenderModel::Reno, seed);
    let again = run(link(200, 20.0, 1e-2), 5_000_000, 4, SenderModel::Reno, seed);
    assert_eq!(first, again, "seed {seed}");
    assert_eq!(
        first.goodput_bytes_per_second.to_bits(),
        again.goodput_bytes_per_second.to_bits(),
        "seed {seed}"
    );
    let other = run(
        link(200, 20.0, 1e-2),
        5_000_000,
        4,
        SenderModel::Reno,
        seed + 1,
    );
    assert_ne!(
        first.completion,
        other.completion,
        "seeds {seed} and {}",
        seed + 1
    );
    assert_ne!(
        first.data_drops,
        other.data_drops,
        "seeds {seed} and {}",
        seed + 1
    );
}

#[test]
fn the_same_seed_replays_an_exchange_round() {
    let seed = test_seed(62);
    let config = ExchangeConfig::new(
        3,
        link(100, 10.0, 1e-2),
        3_000_000,
        2,
        SenderModel::Reno,
        seed,
    );
    let first = exchange(&config);
    assert_eq!(first, exchange(&config), "seed {seed}");
    let other = exchange(&ExchangeConfig {
        seed: seed + 1,
        ..config
    });
    assert_ne!(
        first.map(|report| report.round),
        other.map(|report| report.round),
        "seeds {seed} and {}",
        seed + 1
    );
}
