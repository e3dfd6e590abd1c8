//! `/api/users` and `/api/users/{name}`: list, read, create or replace,
//! delete users (administrator only), in RabbitMQ's JSON shapes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::{parse_tags, User};
use berth_broker::password::{Algorithm, PasswordHash};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{access_error, bad_request, not_found};
use super::{AdminAuthed, HttpState};

/// A user as RabbitMQ's API shows it.
pub(super) fn user_json(u: &User) -> Value {
    let (hash, algorithm) = u
        .password_hash
        .as_ref()
        .map_or((String::new(), Algorithm::Sha256.name()), |h| {
            (h.to_base64(), h.algorithm.name())
        });
    json!({
        "name": u.name,
        "password_hash": hash,
        "hashing_algorithm": algorithm,
        "tags": u.tags,
        "limits": {},
    })
}

pub async fn list(State(st): State<HttpState>, _: AdminAuthed) -> Response {
    let users: Vec<Value> = st
        .shared
        .broker
        .access()
        .users()
        .iter()
        .map(|u| user_json(u))
        .collect();
    Json(users).into_response()
}

pub async fn get_one(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    match st.shared.broker.access().user(&name) {
        Some(u) => Json(user_json(&u)).into_response(),
        None => not_found(),
    }
}

/// The body of `PUT /api/users/{name}`.
#[derive(Debug, Deserialize)]
pub struct PutUser {
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    password_hash: Option<String>,
    #[serde(default)]
    hashing_algorithm: Option<String>,
    #[serde(default)]
    tags: Option<Value>,
}

fn tags_of(v: Option<&Value>) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(parse_tags(s)),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "tags must be strings".to_owned())
            })
            .collect(),
        Some(_) => Err("tags must be a comma-separated string or a list".into()),
    }
}

pub async fn put(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
    body: Json<PutUser>,
) -> Response {
    let access = st.shared.broker.access();
    let existing = access.user(&name);
    let tags = match tags_of(body.tags.as_ref()) {
        Ok(t) => t,
        Err(why) => return bad_request(why),
    };
    let password_hash = match (&body.password, &body.password_hash) {
        (Some(p), _) => Some(PasswordHash::new(p)),
        (None, Some(h)) if h.is_empty() => None,
        (None, Some(h)) => {
            let alg_name = body
                .hashing_algorithm
                .as_deref()
                .unwrap_or(Algorithm::Sha256.name());
            let Some(alg) = Algorithm::from_name(alg_name) else {
                return bad_request(format!("unknown hashing_algorithm '{alg_name}'"));
            };
            match PasswordHash::from_base64(alg, h) {
                Ok(h) => Some(h),
                Err(e) => return bad_request(e.to_string()),
            }
        }
        (None, None) => match &existing {
            Some(u) => u.password_hash.clone(),
            None => return bad_request("password or password_hash is required"),
        },
    };
    let user = User {
        name,
        password_hash,
        tags,
    };
    match access.put_user(user) {
        Ok(()) if existing.is_some() => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub async fn delete(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    match st.shared.broker.access().delete_user(&name) {
        Ok(()) => {
            // RabbitMQ closes a deleted user's connections with 320.
            for c in st.shared.registry.list() {
                if c.user == name {
                    c.close(format!("user '{name}' is deleted"));
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => access_error(&e),
    }
}
