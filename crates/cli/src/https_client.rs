//! TLS for the CLI's API client (`--url https://...`): rustls (ring
//! provider, TLS 1.2 and 1.3) over a blocking TCP stream, the server
//! verified against `--ca-file` or, without it, the system's CA bundle.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Where Debian and most Linux systems keep the trusted CAs.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A byte stream the API client talks HTTP over (plain or TLS).
pub trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// Wraps `tcp` in TLS to `host`, verifying the server's certificate.
pub fn wrap(tcp: TcpStream, host: &str, ca_file: Option<&Path>) -> Result<Box<dyn Stream>, String> {
    let ca = ca_file.unwrap_or(Path::new(SYSTEM_CA_BUNDLE));
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| {
            format!(
                "cannot read CA certificates from {}: {e} (give a PEM file with --ca-file)",
                ca.display()
            )
        })?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "{} holds no usable CA certificate (give a PEM file with --ca-file)",
            ca.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
    .map_err(|e| format!("{host} is not a valid TLS server name: {e}"))?;
    let conn = ClientConnection::new(Arc::new(config), name)
        .map_err(|e| format!("TLS setup failed: {e}"))?;
    Ok(Box::new(StreamOwned::new(conn, tcp)))
}
