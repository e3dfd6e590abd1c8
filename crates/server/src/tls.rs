//! TLS for AMQPS with rustls (ring provider; TLS 1.2 and 1.3): the server
//! certificate and key from PEM files, optional client-certificate
//! verification against a CA file (RabbitMQ's `verify_peer` and
//! `fail_if_no_peer_cert`), reload of the certificate and key on SIGHUP,
//! and the user name a client certificate carries (for `EXTERNAL`).
//!
//! Invariants:
//! - A missing, unreadable or empty PEM file, or a key that does not match
//!   its certificate, is a startup error naming the file.
//! - A reload that fails keeps the certificate in use (and says why);
//!   established connections are never touched by a reload.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config;

/// What went wrong setting TLS up, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls.{key} is required when net.amqps_listen is set (flag --tls-{flag})")]
    Missing {
        key: &'static str,
        flag: &'static str,
    },
    #[error("cannot read {what} from {path}: {source} (expected a PEM file)")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no {what} (expected a PEM file with one)")]
    Empty { what: &'static str, path: PathBuf },
    #[error("the key in {key} does not fit the certificate in {cert}: {source}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("CA file {path}: {source}")]
    Ca {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("TLS setup failed: {0}")]
    Setup(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let list = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if list.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    Ok(list)
}

fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certs("a certificate", cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "a private key",
            path: key.to_owned(),
        },
        source => TlsError::Read {
            what: "a private key",
            path: key.to_owned(),
            source,
        },
    })?;
    let ck = CertifiedKey::from_der(chain, key_der, &provider()).map_err(|source| {
        TlsError::Mismatch {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        }
    })?;
    Ok(Arc::new(ck))
}

/// The server certificate in use; swapped on reload.
#[derive(Debug)]
struct Reloadable(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Reloadable {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.read()))
    }
}

/// AMQPS's TLS setup.
pub struct Tls {
    acceptor: TlsAcceptor,
    current: Arc<Reloadable>,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Tls {
    /// Reads the files and builds the acceptor.
    pub fn new(c: &config::Tls) -> Result<Self, TlsError> {
        let cert_file = c.cert_file.clone().ok_or(TlsError::Missing {
            key: "cert_file",
            flag: "cert-file",
        })?;
        let key_file = c.key_file.clone().ok_or(TlsError::Missing {
            key: "key_file",
            flag: "key-file",
        })?;
        let current = Arc::new(Reloadable(RwLock::new(certified_key(
            &cert_file, &key_file,
        )?)));
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])?;
        let builder = if c.verify_peer {
            let ca_file = c.ca_file.clone().ok_or(TlsError::Missing {
                key: "ca_file",
                flag: "ca-file",
            })?;
            let mut roots = RootCertStore::empty();
            for ca in certs("a CA certificate", &ca_file)? {
                roots.add(ca).map_err(|e| TlsError::Ca {
                    path: ca_file.clone(),
                    source: Box::new(e),
                })?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let v = if c.fail_if_no_peer_cert {
                v
            } else {
                v.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(v.build().map_err(|e| TlsError::Ca {
                path: ca_file.clone(),
                source: Box::new(e),
            })?)
        } else {
            builder.with_no_client_auth()
        };
        let mut server = builder.with_cert_resolver(Arc::clone(&current) as _);
        server.alpn_protocols.clear();
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            current,
            cert_file,
            key_file,
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Rereads the certificate and key (SIGHUP); new connections get the
    /// new ones, established ones keep theirs. On error the old ones stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let ck = certified_key(&self.cert_file, &self.key_file)?;
        *self.current.0.write() = ck;
        Ok(())
    }
}

/// The subject common name (CN) of a DER certificate: the user name
/// `EXTERNAL` logs in as (RabbitMQ's `ssl_cert_login_from = common_name`).
pub fn common_name(der: &[u8]) -> Option<String> {
    const CN_OID: &[u8] = &[0x55, 0x04, 0x03];
    let (_, cert, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    // version [0] (optional), serial, signature, issuer, validity, subject
    if tbs.first() == Some(&0xA0) {
        tbs = tlv(tbs)?.2;
    }
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (_, mut subject, _) = tlv(tbs)?;
    while !subject.is_empty() {
        let (_, mut rdn, rest) = tlv(subject)?;
        subject = rest;
        while !rdn.is_empty() {
            let (_, atv, rest) = tlv(rdn)?;
            rdn = rest;
            let (tag, oid, value) = tlv(atv)?;
            if tag == 0x06 && oid == CN_OID {
                let (_, s, _) = tlv(value)?;
                return String::from_utf8(s.to_vec()).ok();
            }
        }
    }
    None
}

/// One DER tag-length-value: (tag, content, the bytes after it).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)?;
    let (len, head) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*b.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    Some((tag, b.get(head..end)?, b.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::tlv;

    #[test]
    fn der_lengths_short_and_long_form_and_truncation() {
        assert_eq!(
            tlv(&[0x04, 0x01, 0xAA, 0xBB]),
            Some((0x04, &[0xAA][..], &[0xBB][..]))
        );
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend(std::iter::repeat_n(0u8, 0x80));
        assert_eq!(tlv(&long).map(|t| t.1.len()), Some(0x80));
        assert_eq!(tlv(&[0x04, 0x05, 0x00]), None, "truncated content");
        assert_eq!(tlv(&[0x04, 0x85, 1, 1, 1, 1, 1]), None, "length too long");
    }
}
