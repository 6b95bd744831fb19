//! Certificates made for one test.

use std::path::Path;

use longhaul_coordinator::server::tls::TlsMaterial;
use longhaul_core::identity;

/// A certificate authority made for one test, and certificates it signs.
pub struct TestCa {
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate().expect("generate a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("self-sign the CA");
        Self {
            ca_pem: ca.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// The CA's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate and its key (PEM) with these subject alternative names.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("generate a key");
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("certificate parameters");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign a certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// [`TestCa::issue`] as the TLS material a replica or client is given.
    pub fn material(&self, names: &[&str]) -> TlsMaterial {
        let (cert, key) = self.issue(names);
        TlsMaterial::from_pem(self.ca_pem.clone(), cert, key)
    }

    /// A replica's certificate: 127.0.0.1 and localhost, where test replicas
    /// listen, and the replica role.
    pub fn replica(&self) -> TlsMaterial {
        self.material(&["127.0.0.1", "localhost", identity::REPLICA_NAME])
    }

    /// An operator's certificate.
    pub fn operator(&self) -> TlsMaterial {
        self.material(&[identity::OPERATOR_NAME])
    }

    /// Writes `ca.pem`, `NAME.pem` and `NAME.key` (for these names) into `dir`.
    pub fn write(&self, dir: &Path, name: &str, names: &[&str]) {
        let (cert, key) = self.issue(names);
        std::fs::write(dir.join("ca.pem"), &self.ca_pem).expect("write ca.pem");
        std::fs::write(dir.join(format!("{name}.pem")), cert).expect("write a certificate");
        std::fs::write(dir.join(format!("{name}.key")), key).expect("write a key");
    }
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
