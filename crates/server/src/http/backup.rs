//! `POST /api/berth/store/backup` (administrator only), body
//! `{"dir": "/absolute/path"}`: backs the running broker's store up into
//! that new or empty directory on the broker's machine, as `berth store
//! backup` does offline, with the cut taken while every log group's
//! writer is paused (`Store::backup`), so a message moved between groups
//! meanwhile (dead-lettering) is in the backup. `berth store backup
//! --online` calls it.
//!
//! Answers `{"backup", "files", "bytes", "trimmed_bytes", "log_groups",
//! "source_data_dirs", "segment_size_bytes", "pause_us"}`; a relative or
//! missing `dir`, a non-empty target or a cut the writers could not pause
//! for is a 400 saying so, a copy that does not verify a 500.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_store::StoreError;
use serde_json::{json, Value};

use super::error::bad_request;
use super::{AdminAuthed, HttpState};

/// The target directory of the request body, or why it is not usable.
fn target_dir(body: &[u8]) -> Result<PathBuf, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the body must be JSON {{\"dir\": \"/absolute/path\"}}: {e}"))?;
    let dir = v
        .get("dir")
        .and_then(Value::as_str)
        .ok_or("the body must name the backup directory: {\"dir\": \"/absolute/path\"}")?;
    let dir = PathBuf::from(dir);
    if !dir.is_absolute() {
        return Err(format!(
            "dir {} is relative: give an absolute path (the broker writes the backup on its own \
             machine, from its own working directory)",
            dir.display()
        ));
    }
    Ok(dir)
}

pub(super) async fn backup(State(st): State<HttpState>, _: AdminAuthed, body: Bytes) -> Response {
    let dir = match target_dir(&body) {
        Ok(d) => d,
        Err(reason) => return bad_request(reason),
    };
    let journal = std::sync::Arc::clone(&st.journal);
    let out = dir.clone();
    let done = tokio::task::spawn_blocking(move || {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        journal
            .store
            .backup(&out, env!("CARGO_PKG_VERSION"), now, &|_| {})
    })
    .await;
    let failed = |reason: String| {
        tracing::error!(%reason, "store backup asked through the API failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "internal_server_error", "reason": reason})),
        )
            .into_response()
    };
    match done {
        Err(e) => failed(format!("backup task failed: {e}")),
        Ok(Err(e @ StoreError::Config(_))) => bad_request(e.to_string()),
        Ok(Err(e)) => failed(format!("backup failed: {e}")),
        Ok(Ok(r)) => Json(json!({
            "backup": dir,
            "files": r.manifest.files.len(),
            "bytes": r.bytes,
            "trimmed_bytes": r.trimmed_bytes,
            "log_groups": r.manifest.log_groups,
            "source_data_dirs": r.manifest.source_data_dirs,
            "segment_size_bytes": r.manifest.segment_size_bytes,
            "pause_us": r.pause.map_or(0, |p| u64::try_from(p.as_micros()).unwrap_or(u64::MAX)),
        }))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_must_be_named_and_absolute() {
        assert_eq!(
            target_dir(br#"{"dir": "/backups/x"}"#),
            Ok(PathBuf::from("/backups/x"))
        );
        assert!(target_dir(br#"{"dir": "backups/x"}"#)
            .unwrap_err()
            .contains("relative"));
        assert!(target_dir(b"{}").unwrap_err().contains("must name"));
        assert!(target_dir(b"dir=/x").unwrap_err().contains("must be JSON"));
    }
}
