//! The simulator's HTTP API: `POST /charges` (in `charge`), the ledger's
//! views, and the admin endpoints.

use super::answer::error;
use super::charge::create_charge;
use super::knobs::Knobs;
use super::ledger::Ledger;
use super::report::Lookup;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub(super) struct AppState {
    pub ledger: Ledger,
    pub knobs: Arc<Mutex<Knobs>>,
}

pub(super) fn router(state: AppState) -> Router {
    Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        .route("/charges/lookup", get(lookup))
        .route("/stats", get(stats))
        .route("/stats/keys", get(per_key))
        .route("/admin/knobs", get(get_knobs).post(set_knobs))
        .route("/admin/forget-keys", post(forget_keys))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

fn internal(e: sqlx::Error) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable", e)
}

#[derive(Deserialize)]
struct ListQuery {
    key: Option<String>,
    tenant: Option<String>,
}

async fn list_charges(State(s): State<AppState>, Query(q): Query<ListQuery>) -> Response {
    match s.ledger.list(q.key.as_deref(), q.tenant.as_deref()).await {
        Ok(charges) => Json(json!({ "count": charges.len(), "charges": charges })).into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct LookupQuery {
    key: String,
}

/// What a retry of the POST with this key would be answered, without
/// charging: the stored answer (200, or 402 for a declined card), 409
/// while the first request runs, 404 for a key never seen or forgotten.
async fn lookup(State(s): State<AppState>, Query(q): Query<LookupQuery>) -> Response {
    match s.ledger.lookup(&q.key).await {
        Ok(Lookup::Finished(answer)) => answer.into_response(),
        Ok(Lookup::Running) => error(
            StatusCode::CONFLICT,
            "in_progress",
            "a request with this key is still running",
        ),
        Ok(Lookup::Unknown) => error(
            StatusCode::NOT_FOUND,
            "no_such_charge",
            "no charge has this key",
        ),
        Err(e) => internal(e),
    }
}

async fn stats(State(s): State<AppState>) -> Response {
    match s.ledger.stats().await {
        Ok(stats) => Json(stats).into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct TenantQuery {
    tenant: Option<String>,
}

async fn per_key(State(s): State<AppState>, Query(q): Query<TenantQuery>) -> Response {
    match s.ledger.per_key(q.tenant.as_deref()).await {
        Ok(keys) => Json(keys).into_response(),
        Err(e) => internal(e),
    }
}

async fn forget_keys(State(s): State<AppState>) -> Response {
    match s.ledger.forget_keys().await {
        Ok(n) => Json(json!({ "forgotten": n })).into_response(),
        Err(e) => internal(e),
    }
}

async fn get_knobs(State(s): State<AppState>) -> Json<Knobs> {
    Json(s.knobs.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Merges a partial JSON object into the current knobs.
async fn set_knobs(State(s): State<AppState>, Json(patch): Json<Value>) -> Response {
    let mut knobs = s.knobs.lock().unwrap_or_else(|e| e.into_inner());
    match knobs.patched(patch) {
        Ok(new) => {
            *knobs = new.clone();
            Json(new).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_knobs", e),
    }
}
