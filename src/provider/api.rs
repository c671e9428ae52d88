//! The simulator's HTTP API: POST /charges, GET /charges, GET /stats,
//! GET|POST /admin/knobs.

use super::knobs::Knobs;
use super::ledger::{Caller, Existing, Ledger};
use crate::fingerprint::{hex, write_canonical};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};

/// The card number that is always declined (as in common provider test suites).
pub const DECLINED_CARD: &str = "4000000000000002";

#[derive(Clone)]
pub(super) struct AppState {
    pub ledger: Ledger,
    pub knobs: Arc<Mutex<Knobs>>,
}

pub(super) fn router(state: AppState) -> Router {
    Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        .route("/stats", get(stats))
        .route("/admin/knobs", get(get_knobs).post(set_knobs))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, detail: impl std::fmt::Display) -> Response {
    (
        status,
        Json(json!({ "error": code, "detail": detail.to_string() })),
    )
        .into_response()
}

fn internal(e: sqlx::Error) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable", e)
}

fn body_hash(body: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(body, &mut canonical);
    hex(&Sha256::digest(canonical.as_bytes()))
}

async fn create_charge(State(s): State<AppState>, headers: HeaderMap, raw: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_json", e),
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (fate, knobs) = {
        let mut k = s.knobs.lock().unwrap_or_else(|e| e.into_inner());
        (k.draw(), k.clone())
    };
    if fate.fail {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected failure",
        );
    }
    if fate.hang_before_charge {
        std::future::pending::<()>().await;
    }
    let tenant = key
        .as_deref()
        .and_then(|k| k.split_once(':'))
        .map(|(t, _)| t.to_string());
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let caller = Caller {
        key: key.as_deref(),
        tenant: tenant.as_deref(),
        owner: header("x-dedupq-owner"),
        attempt: header("x-dedupq-attempt").and_then(|a| a.parse().ok()),
    };
    let hash = body_hash(&body);
    let declined = fate.decline || body.get("card").and_then(Value::as_str) == Some(DECLINED_CARD);

    let id = match (&key, knobs.honour_keys) {
        (Some(key), true) => {
            match s
                .ledger
                .charge_once(key, &caller, &body, &hash, declined)
                .await
            {
                Ok(Ok(id)) => id,
                Ok(Err(Existing::Pending)) => {
                    return error(
                        StatusCode::CONFLICT,
                        "in_progress",
                        "a request with this key is still running",
                    )
                }
                Ok(Err(Existing::Finished { body_hash, .. })) if body_hash != hash => {
                    return error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "idempotency_key_reused",
                        "this key was used with a different body",
                    )
                }
                Ok(Err(Existing::Finished {
                    response, declined, ..
                })) => {
                    let status = if declined {
                        StatusCode::PAYMENT_REQUIRED
                    } else {
                        StatusCode::OK
                    };
                    return (status, [("idempotent-replayed", "true")], Json(response))
                        .into_response();
                }
                Err(e) => return internal(e),
            }
        }
        _ => match s
            .ledger
            .charge_always(&caller, &body, &hash, declined)
            .await
        {
            Ok(id) => id,
            Err(e) => return internal(e),
        },
    };
    if declined {
        return error(
            StatusCode::PAYMENT_REQUIRED,
            "card_declined",
            "the card was declined",
        );
    }
    // A charge, once recorded, completes even if the caller hangs up (as a
    // real provider's does): otherwise it would stay pending and answer
    // every retry with 409.
    let ledger = s.ledger.clone();
    let finish = tokio::spawn(async move {
        tokio::time::sleep(knobs.latency).await;
        let response = json!({
            "id": format!("ch_{id}"),
            "status": "succeeded",
            "amount": body.get("amount"),
            "currency": body.get("currency"),
            "idempotency_key": key,
        });
        ledger
            .succeed(id, &response, !fate.hang_after_charge)
            .await
            .map(|()| response)
    });
    let response = match finish.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => return internal(e),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "charge_task", e),
    };
    if fate.hang_after_charge {
        std::future::pending::<()>().await;
    }
    (StatusCode::CREATED, Json(response)).into_response()
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

async fn stats(State(s): State<AppState>) -> Response {
    match s.ledger.stats().await {
        Ok(stats) => Json(stats).into_response(),
        Err(e) => internal(e),
    }
}

async fn get_knobs(State(s): State<AppState>) -> Json<Knobs> {
    Json(s.knobs.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Merges a partial JSON object into the current knobs.
async fn set_knobs(State(s): State<AppState>, Json(patch): Json<Value>) -> Response {
    let mut knobs = s.knobs.lock().unwrap_or_else(|e| e.into_inner());
    let mut current = match serde_json::to_value(&*knobs) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "knobs", e),
    };
    if let (Value::Object(cur), Value::Object(p)) = (&mut current, patch) {
        cur.extend(p);
    }
    match serde_json::from_value::<Knobs>(current) {
        Ok(new) => {
            *knobs = new.clone();
            Json(new).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_knobs", e),
    }
}
