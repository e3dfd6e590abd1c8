//! The TLS end of an `amqps://` shovel URI: RabbitMQ's URI query
//! parameters (`cacertfile`, `certfile`, `keyfile`, `verify`,
//! `server_name_indication`, docs/SHOVELS.md) read into a rustls client
//! configuration (ring), and the lapin connection made over it.
//!
//! [`Params::of`] only reads the URI (pure, so a definition can be checked
//! without touching files); [`Params::client_config`] reads the files, at
//! every PUT (so a bad path is a 400) and at every connection attempt (so
//! a renewed certificate is picked up by the next run, as RabbitMQ's
//! Erlang client reads them on connect).
//!
//! Invariants:
//! - `verify_peer` (the default, as in RabbitMQ 3.10's Erlang client)
//!   verifies the server's chain against `cacertfile` and its name against
//!   `server_name_indication` or the URI's host; berth never falls back to
//!   an unverified connection.
//! - An error names the URI key and the query parameter it comes from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use lapin::uri::AMQPUri;
use lapin::{AsyncTcpStream, Connection, ConnectionProperties};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tcp_stream::RustlsConnector;

/// The query parameters that are TLS's, as RabbitMQ names them.
pub const TLS_PARAMS: [&str; 5] = [
    "cacertfile",
    "certfile",
    "keyfile",
    "verify",
    "server_name_indication",
];

/// How the server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verify {
    /// Chain against `cacertfile`, name against the server name.
    Peer,
    /// Not at all (`verify=verify_none`): encrypted, not authenticated.
    None,
}

/// What the handshake sends as SNI and checks the certificate's name by.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sni {
    /// The URI's host.
    Host,
    /// `server_name_indication=NAME`.
    Name(String),
    /// `server_name_indication=disable`: no SNI sent; the certificate is
    /// still checked against the host.
    Disable,
}

/// The TLS parameters of one `amqps://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    host: String,
    cacertfile: Option<PathBuf>,
    /// `certfile` and `keyfile`: the client certificate (both or neither).
    client: Option<(PathBuf, PathBuf)>,
    verify: Verify,
    sni: Sni,
}

impl Params {
    /// The TLS parameters of `uri` (given as `key`): `None` for an
    /// `amqp://` URI, which must not carry any. The error is a sentence
    /// naming `key` and the parameter.
    pub fn of(key: &str, uri: &str) -> Result<Option<Self>, String> {
        let url = url::Url::parse(uri).map_err(|e| format!("{key}: not a valid URI: {e}"))?;
        let tls = url.scheme() == "amqps";
        let mut p = Params {
            host: url.host_str().unwrap_or_default().to_owned(),
            cacertfile: None,
            client: None,
            verify: Verify::Peer,
            sni: Sni::Host,
        };
        let (mut certfile, mut keyfile) = (None, None);
        for (name, value) in url.query_pairs() {
            if !TLS_PARAMS.contains(&name.as_ref()) {
                continue;
            }
            if !tls {
                return Err(format!(
                    "{key}: {name} is only of use with amqps:// (TLS), this URI is amqp://"
                ));
            }
            let path = || -> Result<PathBuf, String> {
                if value.is_empty() {
                    return Err(format!(
                        "{key}: {name} is empty; give the path of a PEM file"
                    ));
                }
                Ok(PathBuf::from(value.as_ref()))
            };
            match name.as_ref() {
                "cacertfile" => p.cacertfile = Some(path()?),
                "certfile" => certfile = Some(path()?),
                "keyfile" => keyfile = Some(path()?),
                "verify" => {
                    p.verify = match value.as_ref() {
                        "verify_peer" => Verify::Peer,
                        "verify_none" => Verify::None,
                        other => {
                            return Err(format!(
                                "{key}: verify must be verify_peer or verify_none, got \"{other}\""
                            ))
                        }
                    }
                }
                _ => {
                    p.sni = match value.as_ref() {
                        "disable" => Sni::Disable,
                        "" => return Err(format!("{key}: server_name_indication is empty")),
                        name => Sni::Name(name.to_owned()),
                    }
                }
            }
        }
        if !tls {
            return Ok(None);
        }
        p.client = match (certfile, keyfile) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => return Err(format!("{key}: certfile needs keyfile")),
            (None, Some(_)) => return Err(format!("{key}: keyfile needs certfile")),
        };
        if p.verify == Verify::Peer && p.cacertfile.is_none() {
            return Err(format!(
                "{key}: verify_peer (the default) needs cacertfile, the CA to verify the server \
                 by (berth does not read the system's trust store); or give verify=verify_none"
            ));
        }
        if let Sni::Name(n) = &p.sni {
            ServerName::try_from(n.as_str()).map_err(|e| {
                format!("{key}: server_name_indication \"{n}\" is not a host name: {e}")
            })?;
        }
        Ok(Some(p))
    }

    /// The name the certificate is checked against (and sent as SNI
    /// unless disabled).
    fn server_name(&self) -> &str {
        match &self.sni {
            Sni::Name(n) => n,
            Sni::Host | Sni::Disable => &self.host,
        }
    }

    /// Reads the files and builds the client configuration; the error
    /// names `key` and the parameter whose file is wrong.
    pub fn client_config(&self, key: &str) -> Result<Arc<ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("{key}: TLS setup: {e}"))?;
        let builder = match (&self.verify, &self.cacertfile) {
            (Verify::None, _) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider))),
            (Verify::Peer, Some(ca)) => {
                let mut roots = RootCertStore::empty();
                for cert in certs(key, "cacertfile", ca)? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "{key}: cacertfile {}: not a CA certificate: {e}",
                            ca.display()
                        )
                    })?;
                }
                builder.with_root_certificates(roots)
            }
            (Verify::Peer, None) => {
                return Err(format!("{key}: verify_peer needs cacertfile"));
            }
        };
        let mut config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, keyfile)) => {
                let chain = certs(key, "certfile", cert)?;
                let private = PrivateKeyDer::from_pem_file(keyfile).map_err(|e| {
                    format!(
                        "{key}: keyfile {}: cannot read a private key: {e} (expected a PEM file)",
                        keyfile.display()
                    )
                })?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    format!(
                        "{key}: keyfile {} does not fit certfile {}: {e}",
                        keyfile.display(),
                        cert.display()
                    )
                })?
            }
        };
        config.enable_sni = self.sni != Sni::Disable;
        Ok(Arc::new(config))
    }
}

/// The certificates of the PEM file at `path` (parameter `param` of
/// `key`), at least one.
fn certs(
    key: &str,
    param: &str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let read = |e: rustls::pki_types::pem::Error| {
        format!(
            "{key}: {param} {}: cannot read certificates: {e} (expected a PEM file)",
            path.display()
        )
    };
    let list = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if list.is_empty() {
        return Err(format!(
            "{key}: {param} {}: holds no certificate (expected a PEM file)",
            path.display()
        ));
    }
    Ok(list)
}

/// `verify=verify_none`: any certificate is taken; the handshake's
/// signatures are still checked (the peer holds the key of the
/// certificate it sent).
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
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
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Opens an AMQP connection to `uri` over TLS with `params` (lapin runs
/// the AMQP side over the stream this hands it). Reads the certificate
/// files first; their errors come back as `Err` text.
pub async fn connect(
    key: &str,
    uri: &str,
    params: &Params,
    props: ConnectionProperties,
) -> Result<Connection, String> {
    let config = params.client_config(key)?;
    let parsed: AMQPUri = uri.parse()?;
    let runtime = lapin::runtime::default_runtime().map_err(|e| e.to_string())?;
    let connector = RustlsConnector::from(config);
    let server_name = params.server_name().to_owned();
    Connection::connector(
        parsed,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((uri.authority.host.as_str(), uri.authority.port))
                    .await?
                    .collect();
            let tcp = AsyncTcpStream::connect(&runtime, addrs).await?;
            Ok(tcp.into_rustls(&connector, &server_name).await?)
        },
        props,
    )
    .await
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amqp_uris_have_no_tls_and_may_not_carry_its_parameters() {
        assert_eq!(Params::of("src-uri", "amqp://h/%2f").unwrap(), None);
        let e = Params::of("src-uri", "amqp://h/%2f?cacertfile=/ca.pem").unwrap_err();
        assert!(
            e.contains("src-uri: cacertfile is only of use with amqps://"),
            "{e}"
        );
    }

    #[test]
    fn verify_peer_is_the_default_and_needs_a_ca() {
        let e = Params::of("dest-uri", "amqps://h/%2f").unwrap_err();
        assert!(
            e.contains("dest-uri: verify_peer (the default) needs cacertfile"),
            "{e}"
        );
        let p = Params::of("dest-uri", "amqps://h/%2f?verify=verify_none")
            .unwrap()
            .unwrap();
        assert_eq!(p.verify, Verify::None);
        let p = Params::of("dest-uri", "amqps://h:5671/%2f?cacertfile=%2Fca.pem")
            .unwrap()
            .unwrap();
        assert_eq!(p.cacertfile, Some(PathBuf::from("/ca.pem")));
        assert_eq!(p.server_name(), "h");
    }

    #[test]
    fn bad_parameters_are_named() {
        let cases = [
            (
                "amqps://h?verify=yes",
                "verify must be verify_peer or verify_none",
            ),
            (
                "amqps://h?verify=verify_none&certfile=/c",
                "certfile needs keyfile",
            ),
            (
                "amqps://h?verify=verify_none&keyfile=/k",
                "keyfile needs certfile",
            ),
            (
                "amqps://h?verify=verify_none&cacertfile=",
                "cacertfile is empty",
            ),
            (
                "amqps://h?verify=verify_none&server_name_indication=a%20b",
                "server_name_indication \"a b\" is not a host name",
            ),
        ];
        for (uri, want) in cases {
            let e = Params::of("src-uri", uri).unwrap_err();
            assert!(e.contains(want), "{uri}: {e}");
        }
    }

    #[test]
    fn server_name_indication_names_the_server_or_is_disabled() {
        let p = Params::of(
            "k",
            "amqps://10.0.0.1?verify=verify_none&server_name_indication=mq.example",
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.server_name(), "mq.example");
        let p = Params::of(
            "k",
            "amqps://mq?verify=verify_none&server_name_indication=disable",
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.sni, Sni::Disable);
        assert_eq!(p.server_name(), "mq");
        assert!(!p.client_config("k").unwrap().enable_sni);
    }

    #[test]
    fn a_missing_file_is_named_by_its_parameter() {
        let p = Params::of("dest-uri", "amqps://h?cacertfile=/nonexistent/ca.pem")
            .unwrap()
            .unwrap();
        let e = p.client_config("dest-uri").unwrap_err();
        assert!(
            e.starts_with("dest-uri: cacertfile /nonexistent/ca.pem: cannot read"),
            "{e}"
        );
        let p = Params::of(
            "dest-uri",
            "amqps://h?verify=verify_none&certfile=/nonexistent/c.pem&keyfile=/nonexistent/k.pem",
        )
        .unwrap()
        .unwrap();
        let e = p.client_config("dest-uri").unwrap_err();
        assert!(
            e.starts_with("dest-uri: certfile /nonexistent/c.pem: cannot read"),
            "{e}"
        );
    }
}
