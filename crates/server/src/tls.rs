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
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::config;

/// What went wrong setting TLS up, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls.{key} is required when net.amqps_listen, net.https_listen or net.mqtts_listen is set (flag --tls-{flag})")]
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

fn ca_error(path: &Path, e: impl std::error::Error + Send + Sync + 'static) -> TlsError {
    TlsError::Ca {
        path: path.to_owned(),
        source: Box::new(e),
    }
}

/// The CA certificates of `ca_file`, to verify peers by.
fn roots(ca_file: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certs("a CA certificate", ca_file)? {
        roots.add(ca).map_err(|e| ca_error(ca_file, e))?;
    }
    Ok(Arc::new(roots))
}

/// Everything a handshake needs, built from the files in one go.
fn server_config(c: &config::Tls) -> Result<ServerConfig, TlsError> {
    let cert_file = c.cert_file.as_deref().ok_or(TlsError::Missing {
        key: "cert_file",
        flag: "cert-file",
    })?;
    let key_file = c.key_file.as_deref().ok_or(TlsError::Missing {
        key: "key_file",
        flag: "key-file",
    })?;
    let key = certified_key(cert_file, key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])?;
    let builder = if c.verify_peer {
        let ca_file = c.ca_file.as_deref().ok_or(TlsError::Missing {
            key: "ca_file",
            flag: "ca-file",
        })?;
        let v = WebPkiClientVerifier::builder_with_provider(roots(ca_file)?, provider());
        let v = if c.fail_if_no_peer_cert {
            v
        } else {
            v.allow_unauthenticated()
        };
        builder.with_client_cert_verifier(v.build().map_err(|e| ca_error(ca_file, e))?)
    } else {
        builder.with_no_client_auth()
    };
    let mut server = builder.with_cert_resolver(Arc::new(Fixed(key)));
    server.alpn_protocols.clear();
    Ok(server)
}

/// TLS between cluster members: each side presents `tls.cert_file` and
/// requires the other's certificate, signed by `tls.ca_file` (whatever
/// `verify_peer` says for clients: a member without a certificate is a
/// stranger).
pub fn peer_tls(
    c: &config::Tls,
    members_ca: Option<&std::path::Path>,
) -> Result<berth_cluster::PeerTls, TlsError> {
    let missing = |key, flag| TlsError::Missing { key, flag };
    let cert_file = c
        .cert_file
        .as_deref()
        .ok_or(missing("cert_file", "cert-file"))?;
    let key_file = c
        .key_file
        .as_deref()
        .ok_or(missing("key_file", "key-file"))?;
    let ca_file = members_ca
        .or(c.ca_file.as_deref())
        .ok_or(missing("ca_file", "ca-file"))?;
    let key = certified_key(cert_file, key_file)?;
    let roots = roots(ca_file)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
        .build()
        .map_err(|e| ca_error(ca_file, e))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Fixed(Arc::clone(&key))));
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(FixedClient(key)));
    Ok(berth_cluster::PeerTls {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

/// The one certificate a member presents as a client.
#[derive(Debug)]
struct FixedClient(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedClient {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The one certificate of a [`ServerConfig`].
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

/// The TLS setup shared by AMQPS and HTTPS: one reload serves both.
pub struct Tls {
    /// The acceptor in use; a reload swaps in a new one, so connections
    /// that already finished their handshake are never touched.
    acceptor: RwLock<TlsAcceptor>,
    files: config::Tls,
}

impl Tls {
    /// Reads the files and builds the acceptor.
    pub fn new(c: &config::Tls) -> Result<Self, TlsError> {
        Ok(Self {
            acceptor: RwLock::new(TlsAcceptor::from(Arc::new(server_config(c)?))),
            files: c.clone(),
        })
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().clone()
    }

    /// Rereads the certificate, the key and the CA file (SIGHUP); new
    /// connections get the new ones, established ones keep theirs. On
    /// error the old ones stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = TlsAcceptor::from(Arc::new(server_config(&self.files)?));
        *self.acceptor.write() = fresh;
        Ok(())
    }
}

/// Reloads `tls` on every SIGHUP until `shutdown` changes (one reload
/// serves AMQPS and HTTPS alike).
pub fn reload_on_sighup(tls: &Arc<Tls>, shutdown: &watch::Receiver<bool>) {
    let tls = Arc::clone(tls);
    let mut stop = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!(
                "cannot install the SIGHUP handler; TLS certificates will not be reloaded"
            );
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and CA file reloaded"),
                    Err(e) => tracing::error!("SIGHUP: TLS reload failed, keeping the current certificate: {e}"),
                },
                _ = stop.changed() => return,
            }
        }
    });
}
