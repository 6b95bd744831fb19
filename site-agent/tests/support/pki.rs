//! A test certificate authority and agents' certificates, shared by the
//! test binaries that run agents over mTLS (`#[path]`-included).

use longhaul_core::identity::site_dns_name;
use longhaul_site_agent::tls::AgentTls;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A test certificate authority.
#[derive(Debug)]
pub struct Pki {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub ca_pem: String,
}

/// A certificate and its key, PEM.
#[derive(Debug)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_pem = issuer.pem();
        Self { issuer, ca_pem }
    }

    /// A certificate naming `site` (`<site>.site.longhaul`), for both
    /// client and server use, as an agent's is.
    pub fn leaf(&self, site: &str) -> Leaf {
        let mut params = CertificateParams::new(vec![site_dns_name(site)]).unwrap();
        params.distinguished_name.push(DnType::CommonName, site);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The TLS material of site `site`'s agent.
    pub fn agent(&self, site: &str) -> AgentTls {
        let leaf = self.leaf(site);
        AgentTls::from_pem(
            site,
            self.ca_pem.as_bytes(),
            leaf.cert_pem.as_bytes(),
            leaf.key_pem.as_bytes(),
        )
        .unwrap()
    }
}
