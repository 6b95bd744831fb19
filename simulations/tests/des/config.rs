//! Refused configurations name their field; every run is bounded.

use longhaul_core::units::{DataRate, Distance, Duration};
use longhaul_simulations::des::{
    DesError, ExchangeConfig, Limits, Outcome, SenderModel, TcpParams, TransferConfig, exchange,
    transfer,
};
use longhaul_simulations::link::{LinkConfig, LinkConfigError, Outage};

use crate::link;

fn check(config: TransferConfig, expected: DesError, message: &str) {
    let error = transfer(&config).expect_err("the configuration is refused");
    assert_eq!(error, expected);
    assert_eq!(error.to_string(), message);
}

#[test]
fn bad_transfers_are_refused_with_the_field_named() {
    let good = TransferConfig::new(link(100, 10.0, 0.0), 1_000_000, 2, SenderModel::Reno, 1);
    check(
        TransferConfig {
            connections: 0,
            ..good.clone()
        },
        DesError::Zero {
            field: "connections",
        },
        "`connections` must be positive, found 0",
    );
    check(
        TransferConfig {
            bytes: 0,
            ..good.clone()
        },
        DesError::Zero { field: "bytes" },
        "`bytes` must be positive, found 0",
    );
    check(
        TransferConfig {
            sender: SenderModel::Paced { bits_per_second: 0 },
            ..good.clone()
        },
        DesError::Zero {
            field: "sender.bits_per_second",
        },
        "`sender.bits_per_second` must be positive, found 0",
    );
    check(
        TransferConfig {
            tcp: TcpParams {
                mss_bytes: 0,
                ..TcpParams::default()
            },
            ..good.clone()
        },
        DesError::Zero { field: "mss_bytes" },
        "`mss_bytes` must be positive, found 0",
    );
    let zero_rate = LinkConfig::new(
        DataRate::from_bits_per_second(0),
        Distance::from_km(10.0).expect("a valid distance"),
    );
    let error = transfer(&TransferConfig {
        reverse: Some(zero_rate),
        ..good.clone()
    })
    .expect_err("a zero rate is refused");
    assert!(
        matches!(
            error,
            DesError::Link {
                field: "reverse",
                source: LinkConfigError::ZeroRate { .. }
            }
        ),
        "{error}"
    );
    check(
        TransferConfig {
            bytes: u64::MAX,
            connections: 1,
            ..good
        },
        DesError::TooManySegments {
            field: "bytes",
            bytes: u64::MAX,
            connections: 1,
            max: u64::from(u32::MAX - 1),
        },
        "`bytes` = 18446744073709551615 bytes over 1 connection(s) is more than 4294967294 segments per connection",
    );
}

#[test]
fn bad_exchanges_are_refused_with_the_field_named() {
    let good = ExchangeConfig::new(2, link(100, 10.0, 0.0), 1_000_000, 1, SenderModel::Reno, 1);
    let error = exchange(&ExchangeConfig {
        sites: 1,
        ..good.clone()
    });
    assert_eq!(error, Err(DesError::TooFewSites { found: 1 }));
    let error = exchange(&ExchangeConfig {
        sites: 100_000,
        ..good.clone()
    });
    assert_eq!(
        error,
        Err(DesError::TooManySites {
            found: 100_000,
            max: 256
        })
    );
    let error = exchange(&ExchangeConfig {
        fragment_bytes: 0,
        ..good.clone()
    });
    assert_eq!(
        error,
        Err(DesError::Zero {
            field: "fragment_bytes"
        })
    );
    let error = exchange(&ExchangeConfig {
        connections: 0,
        ..good
    });
    assert_eq!(
        error,
        Err(DesError::Zero {
            field: "connections"
        })
    );
}

/// A link that is down for a day: the sender backs off and the run stops at
/// its virtual-time bound, not never; a tight event bound stops a busy run.
#[test]
fn runs_stop_at_their_bounds() {
    let mut down = link(100, 10.0, 0.0);
    down.outages = vec![Outage {
        from: Duration::from_nanos(0),
        until: Duration::from_secs(86_000),
    }];
    let mut config = TransferConfig::new(down, 1_000_000, 1, SenderModel::Reno, 3);
    config.limits = Limits {
        max_virtual_time: Duration::from_secs(600),
        max_events: 1_000_000,
    };
    let report = transfer(&config).expect("a valid configuration");
    assert_eq!(report.outcome, Outcome::TimeLimit, "{report:?}");
    assert_eq!(report.bytes_received, 0);
    assert!(
        report.timeouts > 3 && report.data_drops.down > 0,
        "{report:?}"
    );

    let mut config =
        TransferConfig::new(link(100, 10.0, 0.0), 100_000_000, 1, SenderModel::Reno, 4);
    config.limits.max_events = 10_000;
    let report = transfer(&config).expect("a valid configuration");
    assert_eq!(report.outcome, Outcome::EventLimit, "{report:?}");
    assert!(
        report.events >= 10_000 && report.events < 10_100,
        "{report:?}"
    );
}
