//! `POST /api/berth/store/compact` (administrator only): compacts the
//! running broker's store now, as `berth store compact` does offline:
//! every group copies the live records out of its mostly-dead sealed
//! segments, then two checkpoints put the emptied segments behind both so
//! they are deleted. Publishers and consumers keep going meanwhile (each
//! group's writer interleaves the copy with their writes).
//!
//! Answers `{"groups", "bytes_before", "bytes_after", "bytes_freed"}`,
//! counting segment bytes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{AdminAuthed, HttpState};

fn segment_bytes(st: &HttpState) -> u64 {
    st.journal
        .store
        .stats()
        .iter()
        .map(|g| g.segment_bytes)
        .sum()
}

pub(super) async fn compact(State(st): State<HttpState>, _: AdminAuthed) -> Response {
    let journal = std::sync::Arc::clone(&st.journal);
    let before = segment_bytes(&st);
    let done = tokio::task::spawn_blocking(move || {
        let store = &journal.store;
        store
            .compact()
            .and_then(|()| store.checkpoint())
            .and_then(|()| store.checkpoint())
    })
    .await;
    let failed = |reason: String| {
        tracing::error!(%reason, "store compaction asked through the API failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "internal_server_error", "reason": reason})),
        )
            .into_response()
    };
    match done {
        Err(e) => failed(format!("compaction task failed: {e}")),
        Ok(Err(e)) => failed(format!("compaction failed: {e}")),
        Ok(Ok(())) => {
            let after = segment_bytes(&st);
            Json(json!({
                "groups": st.journal.store.group_count(),
                "bytes_before": before,
                "bytes_after": after,
                "bytes_freed": before.saturating_sub(after),
            }))
            .into_response()
        }
    }
}
