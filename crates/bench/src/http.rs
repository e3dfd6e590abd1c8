//! A minimal HTTP/1.1 client (plain TCP, basic auth) for timing a broker's
//! management API status query and triggering its compaction. Only what
//! `GET /api/queues` and `POST /api/berth/store/compact` need: one request
//! per connection, no request body, the response read to EOF.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::BenchError;

/// Largest response accepted, so a runaway listing cannot eat the memory.
pub const RESPONSE_BYTES_MAX: usize = 256 << 20;

/// A parsed `http://[user:pass@]host:port[/base]` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub host_port: String,
    pub auth: Option<(String, String)>,
    pub base_path: String,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<BaseUrl, BenchError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| BenchError::Usage(format!("management URL must be http://…: {url}")))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (auth, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, hp)) => {
                let (u, p) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                (Some((u.to_string(), p.to_string())), hp)
            }
            None => (None, authority),
        };
        let host_port = if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:80")
        };
        Ok(BaseUrl {
            host_port,
            auth,
            base_path: path.to_string(),
        })
    }
}

/// GETs `path` under `base`; returns (status code, body length, time to the
/// last byte).
pub async fn get(
    base: &BaseUrl,
    path: &str,
    timeout: Duration,
) -> Result<(u16, usize, Duration), BenchError> {
    let (status, raw, took) = request_raw(base, "GET", path, timeout).await?;
    Ok((status, raw.len(), took))
}

/// POSTs an empty body to `path` under `base` (e.g. the compaction
/// trigger); returns the status code and the time to the last byte.
pub async fn post(
    base: &BaseUrl,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Duration), BenchError> {
    let (status, _, took) = request_raw(base, "POST", path, timeout).await?;
    Ok((status, took))
}

/// GETs `path` under `base`; returns the status code and the body (a
/// chunked body is decoded).
pub async fn get_body(
    base: &BaseUrl,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), BenchError> {
    let (status, raw, _) = request_raw(base, "GET", path, timeout).await?;
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Err(BenchError::Http(format!(
            "no end of headers in the answer to GET {path} from {}",
            base.host_port
        )));
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    if head.contains("transfer-encoding: chunked") {
        return dechunk(body)
            .map(|b| (status, b))
            .ok_or_else(|| BenchError::Http(format!("malformed chunked body from GET {path}")));
    }
    Ok((status, body.to_vec()))
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

async fn request_raw(
    base: &BaseUrl,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>, Duration), BenchError> {
    let started = Instant::now();
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(&base.host_port).await?;
        let mut req = format!(
            "{method} {}{} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: 0\r\n",
            base.base_path, path, base.host_port
        );
        if let Some((u, p)) = &base.auth {
            req.push_str(&format!(
                "Authorization: Basic {}\r\n",
                base64(format!("{u}:{p}").as_bytes())
            ));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            let n = s.read(&mut chunk).await?;
            if n == 0 || buf.len() + n > RESPONSE_BYTES_MAX {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<Vec<u8>, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BenchError::Timeout(format!("{method} {path} took over {timeout:?}")))?
        .map_err(|source| BenchError::Io {
            context: format!("{method} {path} at {}", base.host_port),
            source,
        })?;
    let status = std::str::from_utf8(buf.get(..12).unwrap_or(&[]))
        .ok()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| BenchError::Http(format!("no HTTP status line from {}", base.host_port)))?;
    Ok((status, buf, started.elapsed()))
}

fn base64(input: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"guest:guest"), "Z3Vlc3Q6Z3Vlc3Q=");
    }

    #[test]
    fn parses_management_urls() {
        let u = BaseUrl::parse("http://guest:guest@127.0.0.1:45672/").unwrap();
        assert_eq!(u.host_port, "127.0.0.1:45672");
        assert_eq!(u.auth, Some(("guest".into(), "guest".into())));
        assert_eq!(u.base_path, "");
        let u = BaseUrl::parse("http://localhost/mgmt").unwrap();
        assert_eq!(u.host_port, "localhost:80");
        assert_eq!(u.base_path, "/mgmt");
        assert!(BaseUrl::parse("https://x").is_err());
    }
}
