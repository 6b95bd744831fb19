//! Optional mutual TLS for clients and peers (rustls through tonic).
//!
//! One CA signs every replica's and client's certificate; a replica accepts
//! only connections that present a certificate from that CA, and presents
//! its own to peers. URLs are then `https://`, and each certificate must name
//! the host it is reached at (DNS name or IP address).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// PEM material of one replica or client.
#[derive(Clone)]
pub struct TlsMaterial {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the certificate cannot be read: {0}")]
    Certificate(String),
    #[error("{what} {path} holds no PEM block (expected \"-----BEGIN {label}\")")]
    NotPem {
        what: &'static str,
        path: String,
        label: &'static str,
    },
}

fn read_pem(what: &'static str, label: &'static str, path: &Path) -> Result<String, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })?;
    if !text.contains("-----BEGIN ") {
        return Err(TlsError::NotPem {
            what,
            path: path.display().to_string(),
            label,
        });
    }
    Ok(text)
}

impl TlsMaterial {
    pub fn from_pem(ca_pem: String, cert_pem: String, key_pem: String) -> Self {
        Self {
            ca_pem,
            cert_pem,
            key_pem,
        }
    }

    /// Reads the CA certificate, this party's certificate and its key.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            ca_pem: read_pem("CA certificate", "CERTIFICATE", ca)?,
            cert_pem: read_pem("certificate", "CERTIFICATE", cert)?,
            key_pem: read_pem("private key", "PRIVATE KEY", key)?,
        })
    }

    /// The roles this party's own certificate names (`longhaul_core::identity`).
    pub fn roles(&self) -> Result<longhaul_core::identity::Roles, TlsError> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        let cert = webpki::EndEntityCert::try_from(&der)
            .map_err(|e| TlsError::Certificate(format!("{e:?}")))?;
        Ok(longhaul_core::identity::Roles::from_dns_names(
            cert.valid_dns_names(),
        ))
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// Serve TLS and require a client certificate signed by the CA.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity())
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
    }

    /// Trust only the CA, and present this party's certificate.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(self.identity())
    }
}
