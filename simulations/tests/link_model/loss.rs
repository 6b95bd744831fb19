use longhaul_simulations::link::{DropCause, Fate, Link, LinkConfig, LossModel};

use crate::{assert_within, config, delivered_at, drive, train, unbounded};

/// A 10 Gbit/s link offered 1500-byte packets every 2 µs (60% load), so the
/// only drops are losses.
fn lossy(loss: LossModel) -> LinkConfig {
    let mut config = unbounded(config(10_000_000_000, 10.0));
    config.loss = loss;
    config
}

fn lost(fates: &[Fate]) -> Vec<bool> {
    fates
        .iter()
        .map(|fate| {
            assert_ne!(
                fate.drop_cause(),
                Some(DropCause::Queue),
                "no queue drops expected"
            );
            fate.drop_cause() == Some(DropCause::Loss)
        })
        .collect()
}

#[test]
fn bernoulli_loss_rate_is_within_five_sigma() {
    // Binomial: standard error sqrt(p(1-p)/n) = 0.000443 for p = 0.02, n = 100 000.
    let (p, n) = (0.02, 100_000u64);
    for seed in [1, 2, 3] {
        let mut link = Link::new(lossy(LossModel::Bernoulli { p }), seed).unwrap();
        let (fates, _) = drive(&mut link, &train(n, 2_000, 1500));
        let losses = lost(&fates).iter().filter(|l| **l).count() as f64;
        let standard_error = (p * (1.0 - p) / n as f64).sqrt();
        assert_within(losses / n as f64, p, standard_error, 5.0, "Bernoulli loss");
        assert_eq!(link.stats().drops.loss, losses as u64);
    }
}

#[test]
fn gilbert_elliott_loss_rate_is_within_five_batch_sigma() {
    // π_bad = p / (p + r) = 1/11; loss = π_bad × 0.6 + π_good × 0.002 = 0.05636.
    // Losses are correlated (bursts of mean 1/r = 10 packets in the bad
    // state), so the standard error is estimated by batch means: 40 batches
    // of 10 000 packets, each much longer than the chain's memory.
    let model = LossModel::GilbertElliott {
        p: 0.01,
        r: 0.1,
        loss_in_bad: 0.6,
        loss_in_good: 0.002,
    };
    let expected = model.stationary_loss().unwrap();
    assert!((expected - (0.6 / 11.0 + 10.0 / 11.0 * 0.002)).abs() < 1e-12);
    let (batches, batch) = (40usize, 10_000usize);
    for seed in [1, 2] {
        let mut link = Link::new(lossy(model.clone()), seed).unwrap();
        let (fates, _) = drive(&mut link, &train((batches * batch) as u64, 2_000, 1500));
        let lost = lost(&fates);
        let means: Vec<f64> = lost
            .chunks(batch)
            .map(|chunk| chunk.iter().filter(|l| **l).count() as f64 / batch as f64)
            .collect();
        let mean = means.iter().sum::<f64>() / batches as f64;
        let variance =
            means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (batches as f64 - 1.0);
        let standard_error = (variance / batches as f64).sqrt();
        // The estimate must itself be sane, or the bound proves nothing.
        assert!(
            standard_error > 0.0 && standard_error < 0.005,
            "{standard_error}"
        );
        assert_within(mean, expected, standard_error, 5.0, "Gilbert-Elliott loss");

        // Losses cluster: after a loss the next packet is lost far more often
        // than on average (about 0.5 against 0.056 here).
        let after_loss = lost.windows(2).filter(|w| w[0]).count() as f64;
        let both = lost.windows(2).filter(|w| w[0] && w[1]).count() as f64;
        assert!(both / after_loss > 5.0 * expected, "{}", both / after_loss);
    }
}

#[test]
fn gilbert_elliott_defaults_to_netem_simple_gilbert() {
    // With 1-h = 1 and 1-k = 0 every bad-state packet is lost: the loss rate
    // is p / (p + r).
    let toml = r#"
        rate = "10 Gbit/s"
        [loss]
        model = "gilbert_elliott"
        p = 0.05
        r = 0.45
    "#;
    let config: LinkConfig = toml::from_str(toml).unwrap();
    let stationary = config.loss.stationary_loss().unwrap();
    assert!((stationary - 0.1).abs() < 1e-12, "{stationary}");
    let mut link = Link::new(unbounded(config), 5).unwrap();
    let n = 100_000;
    let (fates, _) = drive(&mut link, &train(n, 2_000, 1500));
    let rate = fates.iter().filter(|f| !f.is_delivered()).count() as f64 / n as f64;
    // Bursts have mean length 1/r ≈ 2.2, so the binomial error is inflated
    // by about (1 + ρ)/(1 - ρ) with ρ = 1 - p - r = 0.5: a factor 3 in
    // variance; 5 sigma of that.
    let standard_error = (0.1 * 0.9 * 3.0 / n as f64).sqrt();
    assert_within(rate, 0.1, standard_error, 5.0, "simple Gilbert loss");
}

#[test]
fn loss_trace_drops_exactly_the_listed_packets() {
    let mut config = config(1_000_000_000, 1.0);
    config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(3000));
    config.loss = LossModel::Trace {
        drop: vec![0, 2, 3, 7, 1_000],
    };
    let mut link = Link::new(config, 1).unwrap();
    // Packets 0-3 at t = 0 (the buffer holds two), then 4-9 spaced out.
    let mut sends = train(4, 0, 1500);
    sends.extend((4..10).map(|i| crate::Send {
        at_ns: i * 100_000,
        bytes: 1500,
        ecn_capable: false,
    }));
    let (fates, _) = drive(&mut link, &sends);
    let causes: Vec<Option<DropCause>> = fates.iter().map(Fate::drop_cause).collect();
    use DropCause::{Queue, Trace};
    // Packet 2 is listed but the full buffer drops it first; index 3 is
    // counted among offered packets, queue drop or not.
    assert_eq!(
        causes,
        [
            Some(Trace),
            None,
            Some(Queue),
            Some(Queue),
            None,
            None,
            None,
            Some(Trace),
            None,
            None
        ]
    );
    let stats = link.stats();
    assert_eq!((stats.drops.trace, stats.drops.queue), (2, 2));
}

#[test]
fn a_lost_packet_has_used_its_line_time() {
    let mut config = unbounded(config(1_000_000_000, 0.0));
    config.loss = LossModel::Trace { drop: vec![0] };
    let mut link = Link::new(config, 1).unwrap();
    assert_eq!(
        link.handle_send(0, 0, 1500, false).drop_cause(),
        Some(DropCause::Trace)
    );
    // The second packet waits for the lost one's 12 µs on the wire.
    assert_eq!(
        delivered_at(&link.handle_send(0, 1, 1500, false)),
        Some(24_000)
    );
}

#[test]
fn loss_model_changes_at_runtime_and_bad_models_are_refused() {
    let mut link = Link::new(unbounded(config(1_000_000_000, 0.0)), 1).unwrap();
    assert!(link.handle_send(0, 0, 100, false).is_delivered());
    let refused = link.set_loss(LossModel::Bernoulli { p: 2.0 }).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "`loss.p` must be a probability in [0, 1), found 2"
    );
    assert_eq!(link.config().loss, LossModel::None);
    // Trace indices keep counting from the link's first packet.
    link.set_loss(LossModel::Trace { drop: vec![0, 2] })
        .unwrap();
    assert!(link.handle_send(10_000, 1, 100, false).is_delivered());
    assert_eq!(
        link.handle_send(20_000, 2, 100, false).drop_cause(),
        Some(DropCause::Trace)
    );
}
