//! The agent's TLS material: who it is (a certificate naming its site), whom
//! it trusts (the deployment's CA), and the rustls and quinn configurations
//! built from them, for link probes and, later, the gRPC client.
//!
//! An agent's certificate carries the DNS name
//! [`site_dns_name`]`(site)` = `<site>.site.longhaul`. Between agents both
//! sides authenticate (mTLS): a client checks that the server's certificate
//! names the site it meant to reach, a server requires a client certificate
//! signed by the CA and then checks that it names the site the client claims
//! to be ([`certificate_names_site`]).
//!
//! [`AgentTls::insecure_local`] is for a laptop: a self-signed certificate
//! made at start, no verification of peers, and one loud warning.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul_core::identity::{site_dns_name, site_of_dns_name};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The warning [`AgentTls::insecure_local`] logs once.
pub const INSECURE_WARNING: &str = "INSECURE LOCAL MODE: traffic to and from this agent is \
     UNAUTHENTICATED: peer certificates are not verified and any client may connect. \
     For a single machine only, never across sites; configure a CA, certificate and key instead.";

/// Why the agent's TLS material could not be loaded or used. Messages name
/// the file (or in-memory source) and the site concerned.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} file {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {source_name}: not valid PEM: {message}")]
    Pem {
        what: &'static str,
        source_name: String,
        message: String,
    },
    #[error("{what} {source_name}: no CERTIFICATE block found")]
    NoCertificate {
        what: &'static str,
        source_name: String,
    },
    #[error("key {source_name}: no PRIVATE KEY block found (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { source_name: String },
    #[error("site id {site:?} cannot be a certificate name: {reason}")]
    InvalidSite { site: String, reason: String },
    #[error("CA {source_name}: certificate {index} cannot be a trust anchor: {reason}")]
    BadCa {
        source_name: String,
        index: usize,
        reason: String,
    },
    #[error(
        "certificate {source_name} does not name site {site:?}: expected the DNS name {expected_name} ({reason})"
    )]
    WrongSite {
        source_name: String,
        site: String,
        expected_name: String,
        reason: String,
    },
    #[error(
        "certificate {source_name} is not valid for {usage} authentication under the CA {ca_name}: {reason}"
    )]
    NotTrusted {
        source_name: String,
        ca_name: String,
        usage: &'static str,
        reason: String,
    },
    #[error("{what}: {source}")]
    Rustls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot make a self-signed certificate for site {site:?}: {source}")]
    Generate {
        site: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("the TLS configuration has no cipher suite QUIC can start with: {0}")]
    Quic(String),
}

/// How the agent treats peers.
#[derive(Clone)]
enum Trust {
    /// Peers must present certificates signed by one of these roots.
    Verified {
        roots: Arc<RootCertStore>,
        server_verifier: Arc<WebPkiServerVerifier>,
    },
    /// Nothing is verified ([`AgentTls::insecure_local`]).
    InsecureLocal,
}

/// The agent's identity and trust: a certificate chain naming its site, the
/// private key, and the CA it trusts (or insecure local mode). Cheap to clone.
#[derive(Clone)]
pub struct AgentTls {
    site: String,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    trust: Trust,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("AgentTls")
            .field("site", &self.site)
            .field("certificates", &self.chain.len())
            .field("insecure", &self.is_insecure())
            .finish_non_exhaustive()
    }
}

/// Names of the three inputs, for messages.
struct Sources {
    ca: String,
    cert: String,
    key: String,
}

impl AgentTls {
    /// Loads the CA bundle, the agent's certificate chain (leaf first) and its
    /// private key from PEM files, and checks that they fit together: the
    /// certificate names `site_id`, is signed by the CA for both client and
    /// server use, and matches the key. Every error names the file.
    pub fn from_pem_files(
        site_id: &str,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<Self, TlsError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        let sources = Sources {
            ca: ca.display().to_string(),
            cert: cert.display().to_string(),
            key: key.display().to_string(),
        };
        Self::load(
            site_id,
            &read("CA", ca)?,
            &read("certificate", cert)?,
            &read("key", key)?,
            &sources,
        )
    }

    /// As [`AgentTls::from_pem_files`], from PEM text in memory.
    pub fn from_pem(
        site_id: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, TlsError> {
        let sources = Sources {
            ca: "(CA PEM in memory)".to_string(),
            cert: "(certificate PEM in memory)".to_string(),
            key: "(key PEM in memory)".to_string(),
        };
        Self::load(site_id, ca_pem, cert_pem, key_pem, &sources)
    }

    /// Insecure local mode: a self-signed certificate for `site_id` made now,
    /// peers' certificates not verified, no client certificate required.
    /// Logs [`INSECURE_WARNING`] once, here.
    pub fn insecure_local(site_id: &str) -> Result<Self, TlsError> {
        let name = site_name(site_id)?;
        let certified = rcgen::generate_simple_self_signed(vec![name.to_str().into_owned()])
            .map_err(|source| TlsError::Generate {
                site: site_id.to_string(),
                source,
            })?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            certified.signing_key.serialize_der(),
        ));
        tracing::warn!(site = site_id, "{INSECURE_WARNING}");
        metrics::gauge!("longhaul_agent_tls_insecure").set(1.0);
        Ok(Self {
            site: site_id.to_string(),
            chain: vec![certified.cert.der().clone()],
            key: Arc::new(key),
            trust: Trust::InsecureLocal,
            provider: provider(),
        })
    }

    fn load(
        site_id: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        sources: &Sources,
    ) -> Result<Self, TlsError> {
        let name = site_name(site_id)?;
        let ca = certificates("CA", &sources.ca, ca_pem)?;
        let chain = certificates("certificate", &sources.cert, cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| match error {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
                source_name: sources.key.clone(),
            },
            other => TlsError::Pem {
                what: "key",
                source_name: sources.key.clone(),
                message: other.to_string(),
            },
        })?;
        let mut roots = RootCertStore::empty();
        for (index, certificate) in ca.into_iter().enumerate() {
            roots.add(certificate).map_err(|error| TlsError::BadCa {
                source_name: sources.ca.clone(),
                index,
                reason: error.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let provider = provider();
        let server_verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|error| TlsError::BadCa {
                    source_name: sources.ca.clone(),
                    index: 0,
                    reason: error.to_string(),
                })?;
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|error| TlsError::BadCa {
                    source_name: sources.ca.clone(),
                    index: 0,
                    reason: error.to_string(),
                })?;

        // The certificate must work both ways: peers dial this agent (server)
        // and it dials them (client). Check now, with a message naming the
        // file, rather than at the first handshake with a peer.
        let (leaf, intermediates) = match chain.split_first() {
            Some(split) => split,
            None => {
                return Err(TlsError::NoCertificate {
                    what: "certificate",
                    source_name: sources.cert.clone(),
                });
            }
        };
        let now = UnixTime::now();
        server_verifier
            .verify_server_cert(leaf, intermediates, &name, &[], now)
            .map_err(|error| match error {
                rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ) => TlsError::WrongSite {
                    source_name: sources.cert.clone(),
                    site: site_id.to_string(),
                    expected_name: name.to_str().into_owned(),
                    reason: error.to_string(),
                },
                other => TlsError::NotTrusted {
                    source_name: sources.cert.clone(),
                    ca_name: sources.ca.clone(),
                    usage: "server",
                    reason: other.to_string(),
                },
            })?;
        client_verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(|error| TlsError::NotTrusted {
                source_name: sources.cert.clone(),
                ca_name: sources.ca.clone(),
                usage: "client",
                reason: error.to_string(),
            })?;

        let tls = Self {
            site: site_id.to_string(),
            chain,
            key: Arc::new(key),
            trust: Trust::Verified {
                roots,
                server_verifier,
            },
            provider,
        };
        // Building a configuration checks that the key matches the certificate.
        tls.rustls_server_config(&[]).map_err(|error| match error {
            TlsError::Rustls { source, .. } => TlsError::Rustls {
                what: format!(
                    "the key {} does not fit the certificate {}",
                    sources.key, sources.cert
                ),
                source,
            },
            other => other,
        })?;
        Ok(tls)
    }

    /// The site this agent speaks for.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// Whether this is [`AgentTls::insecure_local`] material.
    pub fn is_insecure(&self) -> bool {
        matches!(self.trust, Trust::InsecureLocal)
    }

    /// The agent's certificate chain, leaf first.
    pub fn certificate_chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// A rustls server configuration offering `alpn`: TLS 1.3 only; with a CA,
    /// a client certificate signed by it is required.
    pub fn rustls_server_config(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_error("TLS 1.3 is not available"))?;
        let builder = match &self.trust {
            Trust::Verified { roots, .. } => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::clone(roots),
                    Arc::clone(&self.provider),
                )
                .build()
                .map_err(|error| TlsError::Rustls {
                    what: "cannot build the client certificate verifier".to_string(),
                    source: rustls::Error::General(error.to_string()),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            Trust::InsecureLocal => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(rustls_error("the key does not fit the certificate"))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// A rustls client configuration offering `alpn` and presenting the
    /// agent's certificate; with a CA, the server's certificate must be
    /// signed by it and name the server name dialled.
    pub fn rustls_client_config(&self, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_error("TLS 1.3 is not available"))?;
        let builder = match &self.trust {
            Trust::Verified {
                server_verifier, ..
            } => builder.with_webpki_verifier(Arc::clone(server_verifier)),
            Trust::InsecureLocal => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SkipServerVerification {
                    provider: Arc::clone(&self.provider),
                })),
        };
        let mut config = builder
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(rustls_error("the key does not fit the certificate"))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// A quinn server configuration: [`AgentTls::rustls_server_config`] with
    /// `transport`.
    pub fn quinn_server_config(
        &self,
        alpn: &[&[u8]],
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ServerConfig, TlsError> {
        let crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(self.rustls_server_config(alpn)?)
                .map_err(|error| TlsError::Quic(error.to_string()))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(transport);
        Ok(config)
    }

    /// A quinn client configuration: [`AgentTls::rustls_client_config`] with
    /// `transport`.
    pub fn quinn_client_config(
        &self,
        alpn: &[&[u8]],
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(self.rustls_client_config(alpn)?)
                .map_err(|error| TlsError::Quic(error.to_string()))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(transport);
        Ok(config)
    }
}

/// The certificate name of `site_id`, checked to be a DNS name that stands
/// for exactly that site.
pub fn site_name(site_id: &str) -> Result<ServerName<'static>, TlsError> {
    let invalid = |reason: &str| TlsError::InvalidSite {
        site: site_id.to_string(),
        reason: reason.to_string(),
    };
    let dns = site_dns_name(site_id);
    if site_of_dns_name(&dns) != Some(site_id) {
        return Err(invalid("a site id is non-empty and has no dot"));
    }
    ServerName::try_from(dns)
        .map_err(|_| invalid("a site id is a DNS label: ASCII letters, digits and hyphens"))
}

/// Checks that `certificate` (already verified against the CA) names
/// `site_id`: it carries the DNS name `<site_id>.site.longhaul`.
pub fn certificate_names_site(
    certificate: &CertificateDer<'_>,
    site_id: &str,
) -> Result<(), TlsError> {
    let name = site_name(site_id)?;
    let wrong = |reason: String| TlsError::WrongSite {
        source_name: "presented by the peer".to_string(),
        site: site_id.to_string(),
        expected_name: name.to_str().into_owned(),
        reason,
    };
    let end_entity = webpki::EndEntityCert::try_from(certificate)
        .map_err(|error| wrong(format!("cannot parse it: {error}")))?;
    end_entity
        .verify_is_valid_for_subject_name(&name)
        .map_err(|error| wrong(format!("{error}")))
}

/// Checks that the peer of `connection` presented a certificate (already
/// verified against the CA by the handshake) naming `site_id`; the message
/// of the error says what the peer claimed and why it was refused.
pub fn check_peer_site(connection: &quinn::Connection, site_id: &str) -> Result<(), String> {
    site_name(site_id).map_err(|error| error.to_string())?;
    let chain = connection
        .peer_identity()
        .and_then(|identity| identity.downcast::<Vec<CertificateDer<'static>>>().ok());
    let Some(leaf) = chain.as_deref().and_then(|chain| chain.first()) else {
        return Err(format!(
            "the peer claims site {site_id:?} but presented no certificate"
        ));
    };
    certificate_names_site(leaf, site_id).map_err(|error| format!("refused: {error}"))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(
    what: &'static str,
    source_name: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem {
            what,
            source_name: source_name.to_string(),
            message: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            source_name: source_name.to_string(),
        });
    }
    Ok(certificates)
}

fn rustls_error(what: &'static str) -> impl Fn(rustls::Error) -> TlsError {
    move |source| TlsError::Rustls {
        what: what.to_string(),
        source,
    }
}

/// Insecure local mode's client side: any server certificate is accepted.
/// Handshake signatures are still checked (TLS needs them to be sound), so
/// only the identity is unverified.
#[derive(Debug)]
struct SkipServerVerification {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SkipServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_names_are_checked() {
        assert_eq!(site_name("north").unwrap().to_str(), "north.site.longhaul");
        assert!(matches!(site_name(""), Err(TlsError::InvalidSite { .. })));
        assert!(matches!(
            site_name("a.b"),
            Err(TlsError::InvalidSite { .. })
        ));
        let error = site_name("a b").unwrap_err().to_string();
        assert!(error.contains("\"a b\""), "{error}");
    }

    #[test]
    fn missing_pem_blocks_are_named() {
        let error = AgentTls::from_pem("a", b"", b"", b"").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("CA (CA PEM in memory): no CERTIFICATE"),
            "{error}"
        );
    }
}
