//! The control API: cut, heal, set loss, and request validation.

use longhaul_core::units::Duration;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::emulator_control_client::EmulatorControlClient;
use longhaul_simulations::emulator::{Emulator, control};
use tokio::net::UdpSocket;
use tonic::Code;
use tonic::transport::Channel;

use crate::{bounded, emulator, link, loopback};

async fn client_for(emulator: &Emulator) -> EmulatorControlClient<Channel> {
    let (address, server) = control::serve(emulator.clone(), loopback(), std::future::pending())
        .await
        .unwrap();
    tokio::spawn(server);
    EmulatorControlClient::connect(format!("http://{address}"))
        .await
        .unwrap()
}

/// Sends `count` datagrams through the proxy and counts those that arrive
/// within 200 ms of the last one.
async fn deliver(client: &UdpSocket, receiver: &UdpSocket, count: usize) -> usize {
    for i in 0..count {
        client.send(&[i as u8; 100]).await.unwrap();
        if i % 10 == 9 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    let mut received = 0;
    let mut buffer = [0u8; 200];
    while let Ok(Ok(_)) = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        receiver.recv(&mut buffer),
    )
    .await
    {
        received += 1;
    }
    received
}

fn forward(links: &[pb::EmulatorLinkDirectionStatus]) -> &pb::EmulatorLinkDirectionStatus {
    links.iter().find(|l| l.id == "a->b").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_stops_traffic_heal_resumes_it_and_set_loss_counts_drops() {
    let emulator = emulator(link(1_000_000_000, Duration::from_millis(1)));
    let mut api = client_for(&emulator).await;
    let receiver = UdpSocket::bind(loopback()).await.unwrap();
    let proxy = emulator
        .udp_proxy("a", "b", loopback(), receiver.local_addr().unwrap())
        .await
        .unwrap();
    let client = UdpSocket::bind(loopback()).await.unwrap();
    client.connect(proxy.local_addr()).await.unwrap();

    bounded(30, async {
        assert_eq!(deliver(&client, &receiver, 20).await, 20);

        let cut = api
            .cut(pb::EmulatorCutRequest {
                site: "a".into(),
                peer: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(cut.link_ids, ["a->b", "b->a"]);
        assert_eq!(deliver(&client, &receiver, 20).await, 0);
        let links = api
            .list_links(pb::EmulatorListLinksRequest {})
            .await
            .unwrap()
            .into_inner()
            .links;
        assert!(forward(&links).down);
        assert_eq!(forward(&links).drops.unwrap().down, 20);

        api.heal(pb::EmulatorHealRequest {
            site: "b".into(),
            peer: "a".into(),
        })
        .await
        .unwrap();
        assert_eq!(deliver(&client, &receiver, 20).await, 20);

        let set = api
            .set_link(pb::EmulatorSetLinkRequest {
                site_a: "a".into(),
                site_b: "b".into(),
                one_way: true,
                loss: Some(0.5),
                extra_delay_ns: Some(2_000_000),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(set.links.len(), 1);
        assert_eq!(set.links[0].loss, 0.5);
        assert_eq!(set.links[0].one_way_delay_ns, 3_000_000);
        let received = deliver(&client, &receiver, 200).await;
        // Binomial(200, 0.5): 100 ± 35 is more than 5 standard deviations.
        assert!((65..=135).contains(&received), "{received} of 200 arrived");
        let links = api
            .list_links(pb::EmulatorListLinksRequest {})
            .await
            .unwrap()
            .into_inner()
            .links;
        let drops = forward(&links).drops.unwrap();
        assert_eq!(drops.down, 20);
        assert!(drops.loss >= 65, "{drops:?}");
        assert_eq!(drops.queue, 0);
        // The reverse direction was left alone.
        let backward = links.iter().find(|l| l.id == "b->a").unwrap();
        assert_eq!(backward.loss, 0.0);
        assert!(forward(&links).release_lateness.unwrap().samples > 0);
    })
    .await;
}

#[tokio::test]
async fn bad_requests_name_the_field_and_unknown_links_are_not_found() {
    let emulator = emulator(link(1_000_000_000, Duration::from_millis(1)));
    let mut api = client_for(&emulator).await;
    let set = |site_a: &str, site_b: &str| pb::EmulatorSetLinkRequest {
        site_a: site_a.into(),
        site_b: site_b.into(),
        ..Default::default()
    };
    let cases = [
        (
            pb::EmulatorSetLinkRequest {
                loss: Some(1.5),
                ..set("a", "b")
            },
            Code::InvalidArgument,
            "`loss`",
        ),
        (
            pb::EmulatorSetLinkRequest {
                loss: Some(f64::NAN),
                ..set("a", "b")
            },
            Code::InvalidArgument,
            "`loss`",
        ),
        (
            pb::EmulatorSetLinkRequest {
                rate_bits_per_second: Some(0),
                ..set("a", "b")
            },
            Code::InvalidArgument,
            "`rate_bits_per_second`",
        ),
        (
            pb::EmulatorSetLinkRequest {
                extra_delay_ns: Some(90_000 * 1_000_000_000),
                ..set("a", "b")
            },
            Code::InvalidArgument,
            "`extra_delay_ns`",
        ),
        (set("a", "b"), Code::InvalidArgument, "nothing to change"),
        (
            pb::EmulatorSetLinkRequest {
                loss: Some(0.1),
                ..set("", "b")
            },
            Code::InvalidArgument,
            "`site_a`",
        ),
        (
            pb::EmulatorSetLinkRequest {
                loss: Some(0.1),
                ..set("a", "mars")
            },
            Code::NotFound,
            "\"mars\"",
        ),
    ];
    for (request, code, needle) in cases {
        let status = api.set_link(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), code, "{request:?}: {status:?}");
        assert!(status.message().contains(needle), "{request:?}: {status:?}");
    }
    // A rejected change changed nothing.
    let status = emulator.pipe("a", "b").unwrap().status();
    assert_eq!(status.loss, 0.0);
    assert_eq!(status.one_way_ns, 1_000_000);

    let error = api
        .cut(pb::EmulatorCutRequest {
            site: "mars".into(),
            peer: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
    assert!(error.message().contains("mars"), "{error:?}");
    let error = api
        .heal(pb::EmulatorHealRequest::default())
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("`site`"), "{error:?}");
}
