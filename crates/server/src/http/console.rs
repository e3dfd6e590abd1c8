//! The web console: static HTML, JavaScript and CSS embedded in the binary
//! (files under `crates/server/console/`), served without authentication
//! at `/` and `/console/*`. The console itself calls only the `/api/`
//! endpoints, with HTTP basic auth on every call, as RabbitMQ's UI does.
//!
//! Invariants:
//! - Assets carry no data and no credentials: they are the same bytes for
//!   every visitor, so serving them without auth reveals nothing.
//! - Every answer here has a strict `Content-Security-Policy` (scripts,
//!   styles and fetches from this origin only, no framing), so the
//!   console cannot be made to load or send anything elsewhere.
//! - Assets are revalidated (`Cache-Control: no-cache` with an `ETag` of
//!   their bytes): an upgraded binary never leaves a stale console behind.

use axum::extract::{Path, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::HttpState;

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
    /// FNV-1a of `bytes`, computed at compile time.
    etag: u64,
}

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

macro_rules! asset {
    ($name:literal, $type:literal) => {{
        const BYTES: &[u8] = include_bytes!(concat!("../../console/", $name));
        Asset {
            name: $name,
            content_type: $type,
            bytes: BYTES,
            etag: fnv1a(BYTES),
        }
    }};
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.js", "text/javascript; charset=utf-8"),
    asset!("pages.js", "text/javascript; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// Scripts, styles, images and API calls from this origin only; no
/// plugins, no framing, forms post nowhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes: `/` (the page) and `/console/{file}`. Other paths
/// outside `/api/` stay 404: the console routes with `#/...` fragments,
/// which never reach the server.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/", get(index))
        .route("/console/{file}", get(file))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such console file\n").into_response();
    };
    let etag = format!("\"{:016x}\"", a.etag);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let common = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common, [(header::ETAG, etag)]).into_response();
    }
    (
        common,
        [
            (header::CONTENT_TYPE, a.content_type),
            (header::ETAG, &etag),
        ],
        a.bytes,
    )
        .into_response()
}

/// The console marks its API calls with `X-Requested-With: berth-console`;
/// their 401s then carry no `WWW-Authenticate` challenge, so a browser
/// shows the console's own log-in form and error instead of its native
/// password dialog. Other clients get the challenge as before.
pub(super) async fn quiet_challenge(req: Request, next: Next) -> Response {
    let from_console = req
        .headers()
        .get("x-requested-with")
        .is_some_and(|v| v == HeaderValue::from_static("berth-console"));
    let mut resp = next.run(req).await;
    if from_console && resp.status() == StatusCode::UNAUTHORIZED {
        resp.headers_mut().remove(header::WWW_AUTHENTICATE);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_names_is_embedded() {
        let index = std::str::from_utf8(ASSETS[0].bytes).expect("index.html is UTF-8");
        for a in ASSETS.iter().skip(1) {
            assert!(
                index.contains(&format!("/console/{}", a.name)),
                "index.html does not load {}",
                a.name
            );
        }
    }

    #[test]
    fn etags_differ_for_different_bytes() {
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
