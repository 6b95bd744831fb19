//! Mutual TLS between replicas and clients, with certificates made here.

use std::collections::HashMap;
use std::time::Duration;

use longhaul_coordinator::server::tls::TlsMaterial;
use longhaul_coordinator::server::{Replica, Role};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::util::{eventually, replica_configs};

struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        Self {
            ca_pem: ca.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for 127.0.0.1 and localhost, signed by this CA.
    fn material(&self) -> TlsMaterial {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        TlsMaterial::from_pem(self.ca_pem.clone(), cert.pem(), key.serialize_pem())
    }
}

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
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let mut configs = replica_configs(dir.path(), 3);
    let cluster: HashMap<u64, String> = configs
        .iter()
        .map(|c| (c.id, format!("https://{}", c.listen)))
        .collect();
    let mut replicas = Vec::new();
    for config in &mut configs {
        config.initial_cluster = cluster.clone();
        config.tls = Some(pki.material());
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

    // A client with a certificate from the cluster's CA is served.
    let client = pki.material().client();
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
    let anonymous = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pki.ca_pem));
    assert!(list_jobs(anonymous, addr).await.is_err());
    // So is one whose certificate comes from another CA.
    let stranger = Pki::new()
        .material()
        .client()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem));
    assert!(list_jobs(stranger, addr).await.is_err());
    // And a plaintext client gets nowhere.
    let mut plain = crate::util::client(addr).await;
    assert!(
        plain
            .list_jobs(pb::ListJobsRequest { allow_stale: true })
            .await
            .is_err()
    );

    for replica in replicas {
        replica.stop().await;
    }
}
