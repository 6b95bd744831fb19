//! Mutual TLS between replicas and clients, with certificates made here.

use std::collections::HashMap;
use std::time::Duration;

use longhaul_coordinator::server::{Replica, Role};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::agent_service_client::AgentServiceClient;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::util::{eventually, replica_configs};
use longhaul_testkit::TestCa;

async fn list_jobs(
    tls: ClientTlsConfig,
    addr: std::net::SocketAddr,
) -> Result<pb::ListJobsResponse, tonic::Status> {
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    CoordinatorClient::new(channel)
        .list_jobs(pb::ListJobsRequest { allow_stale: false })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_clients_authenticate_each_other() {
    let pki = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let mut configs = replica_configs(dir.path(), 3);
    let cluster: HashMap<u64, String> = configs
        .iter()
        .map(|c| (c.id, format!("https://{}", c.listen)))
        .collect();
    let mut replicas = Vec::new();
    for config in &mut configs {
        config.initial_cluster = cluster.clone();
        config.tls = Some(pki.replica());
        replicas.push(Replica::start(config.clone()).await.unwrap());
    }
    // Peers reach each other over mTLS: a leader is elected.
    eventually(Duration::from_secs(30), "a leader over mTLS", || async {
        replicas
            .iter()
            .any(|r| r.raft.status().role == Role::Leader)
            .then_some(())
    })
    .await;

    // An operator with a certificate from the cluster's CA is served.
    let client = pki.operator().client();
    let addr = configs[1].listen;
    eventually(
        Duration::from_secs(30),
        "a linearizable read over mTLS",
        || {
            let client = client.clone();
            async move { list_jobs(client, addr).await.ok() }
        },
    )
    .await;

    // A client without a certificate is refused.
    let anonymous = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem()));
    assert!(list_jobs(anonymous, addr).await.is_err());
    // So is one whose certificate comes from another CA.
    let stranger = TestCa::new()
        .operator()
        .client()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()));
    assert!(list_jobs(stranger, addr).await.is_err());
    // And a plaintext client gets nowhere.
    let mut plain = crate::util::client(addr).await;
    assert!(
        plain
            .list_jobs(pb::ListJobsRequest { allow_stale: true })
            .await
            .is_err()
    );

    agents_speak_only_for_the_site_their_certificate_names(&pki, &replicas, &configs).await;
    each_role_reaches_only_its_rpcs(&pki, &replicas, &configs).await;

    for replica in replicas {
        replica.stop().await;
    }
}

fn agent_client(
    tls: ClientTlsConfig,
    addr: std::net::SocketAddr,
) -> AgentServiceClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    AgentServiceClient::new(channel)
}

/// An agent's certificate names its site (`<site>.site.longhaul`); the
/// coordinator refuses it when it speaks for another site, on any replica.
async fn agents_speak_only_for_the_site_their_certificate_names(
    pki: &TestCa,
    replicas: &[Replica],
    configs: &[longhaul_coordinator::server::ReplicaConfig],
) {
    let topology = longhaul_core::Topology::from_toml(
        "two-campuses-80km.toml",
        include_str!("../../../deploy/examples/two-campuses-80km.toml"),
    )
    .unwrap();
    let register = |site: &str| pb::RegisterRequest {
        site_id: site.to_string(),
        inventory: topology
            .site(site)
            .map(longhaul_coordinator::server::convert::site_to_wire),
        data_address: "127.0.0.1:7800".to_string(),
    };
    let follower = replicas
        .iter()
        .zip(configs)
        .find(|(r, _)| r.raft.status().role != Role::Leader)
        .map(|(_, c)| c.listen)
        .unwrap();
    let north = pki
        .material(&[&longhaul_core::identity::site_dns_name("north")])
        .client();
    let mut agent = agent_client(north.clone(), follower);
    // Its own site, through a follower (which forwards with its own,
    // site-less certificate): granted a lease.
    let granted = eventually(Duration::from_secs(30), "north to register", || {
        let mut agent = agent.clone();
        let request = register("north");
        async move { agent.register(request).await.ok() }
    })
    .await
    .into_inner();
    assert_ne!(granted.lease_id, 0);
    let revision = granted.header.unwrap().revision;

    // Another site's data: refused, and the message says why.
    let refused = agent.register(register("south")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("north") && refused.message().contains("\"south\""),
        "{}",
        refused.message()
    );
    let renewal = agent
        .keep_alive(pb::KeepAliveRequest {
            site_id: "south".into(),
            lease_id: granted.lease_id,
        })
        .await
        .unwrap_err();
    assert_eq!(renewal.code(), tonic::Code::PermissionDenied);
    // Claiming to be a forwarding replica does not help an agent.
    let mut forged = tonic::Request::new(register("south"));
    forged.metadata_mut().insert(
        "x-longhaul-forwarded",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let forged = agent.register(forged).await.unwrap_err();
    assert_eq!(forged.code(), tonic::Code::PermissionDenied);
    // A certificate that names no site (a replica's, an operator's) cannot
    // register a site directly either.
    for (holder, material) in [("operator", pki.operator()), ("replica", pki.replica())] {
        let mut client = agent_client(material.client(), follower);
        let refused = client.register(register("south")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().contains(&format!("grants {holder}"))
                && refused.message().contains("only site agents"),
            "{}",
            refused.message()
        );
    }

    // None of the refusals changed anything: south is unknown. (The
    // revision may have moved since: north's lease, never renewed here,
    // expires after the TTL.)
    let mut c = CoordinatorClient::new(
        Endpoint::from_shared(format!("https://{follower}"))
            .unwrap()
            .tls_config(pki.operator().client())
            .unwrap()
            .connect_lazy(),
    );
    let sites = c
        .list_sites(pb::ListSitesRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner();
    assert!(sites.header.unwrap().revision <= revision + 1);
    let ids: Vec<String> = sites
        .sites
        .iter()
        .filter_map(|s| s.site.as_ref().map(|s| s.id.clone()))
        .collect();
    assert_eq!(ids, vec!["north".to_string()]);
}

fn channel(tls: ClientTlsConfig, addr: std::net::SocketAddr) -> tonic::transport::Channel {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// The authorization boundary over real mTLS: the raft transport for
/// replicas only, operator writes for operators (and replicas forwarding
/// them), the forwarding header for replicas only, and a certificate that
/// names no role reaches nothing.
async fn each_role_reaches_only_its_rpcs(
    pki: &TestCa,
    replicas: &[Replica],
    configs: &[longhaul_coordinator::server::ReplicaConfig],
) {
    use longhaul_proto::v1::raft_transport_client::RaftTransportClient;
    let follower = replicas
        .iter()
        .zip(configs)
        .find(|(r, _)| r.raft.status().role != Role::Leader)
        .map(|(_, c)| c.listen)
        .unwrap();
    let north = pki.material(&[&longhaul_core::identity::site_dns_name("north")]);
    let nobody = pki.material(&["127.0.0.1"]);
    let submit = |name: &str| pb::SubmitJobRequest {
        spec: Some(crate::util::small_job(name)),
        expected_revision: 0,
    };
    let denied = |result: Result<_, tonic::Status>, what: &str| {
        let status = result.map(|_: ()| ()).unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{what}: {status:?}"
        );
        status.message().to_string()
    };

    // Raft traffic from anything but a replica is refused before the
    // transport reads a byte of it.
    for (who, material) in [("operator", pki.operator()), ("north", north.clone())] {
        let mut raft = RaftTransportClient::new(channel(material.client(), follower));
        let envelope = pb::RaftEnvelope {
            from: 9,
            to: 1,
            message: vec![0xff; 16],
            cluster_id: 7,
        };
        let result = raft.send(tokio_stream::iter([envelope])).await.map(|_| ());
        let message = denied(result, who);
        assert!(message.contains("only replicas"), "{message}");
    }

    // Operator writes: an operator through a follower (which forwards with
    // its replica certificate) is served; an agent, a replica calling
    // directly, and an operator claiming to forward are not.
    let mut operator = CoordinatorClient::new(channel(pki.operator().client(), follower));
    eventually(Duration::from_secs(30), "an operator's write", || {
        let mut operator = operator.clone();
        async move { operator.submit_job(submit("by-operator")).await.ok() }
    })
    .await;
    let mut agent = CoordinatorClient::new(channel(north.client(), follower));
    let message = denied(
        agent.submit_job(submit("by-agent")).await.map(|_| ()),
        "agent",
    );
    assert!(message.contains("only operators"), "{message}");
    let mut replica = CoordinatorClient::new(channel(pki.replica().client(), follower));
    denied(
        replica.submit_job(submit("by-replica")).await.map(|_| ()),
        "replica",
    );
    let mut forged = tonic::Request::new(submit("forged"));
    forged.metadata_mut().insert(
        "x-longhaul-forwarded",
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let message = denied(
        operator.submit_job(forged).await.map(|_| ()),
        "forged forward",
    );
    assert!(message.contains("only a replica may forward"), "{message}");

    // Reads are open to every role (agents list the sites they probe), but
    // not to a certificate that names none.
    agent
        .list_sites(pb::ListSitesRequest { allow_stale: true })
        .await
        .unwrap();
    let mut stranger = CoordinatorClient::new(channel(nobody.client(), follower));
    let message = denied(
        stranger
            .list_jobs(pb::ListJobsRequest { allow_stale: true })
            .await
            .map(|_| ()),
        "no role",
    );
    assert!(message.contains("no role"), "{message}");

    // Nothing refused was written: only the operator's job exists.
    let jobs = operator
        .list_jobs(pb::ListJobsRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let names: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(names, vec!["by-operator"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_certificate_lacks_the_replica_role_does_not_start() {
    let pki = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let mut config = replica_configs(dir.path(), 1).remove(0);
    config.initial_cluster = [(1, format!("https://{}", config.listen))].into();
    config.tls = Some(pki.material(&["127.0.0.1", "localhost"]));
    let error = Replica::start(config).await.unwrap_err().to_string();
    assert!(
        error.contains("replica.longhaul") && error.contains("no role"),
        "{error}"
    );
}
