//! From a verdict to the HTTP answer: stored results as stored, replays
//! marked `Idempotent-Replayed: true`, everything else as a problem.

use super::decide::{Reply, StoredReply};
use super::problem::Problem;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

/// Marks an answer that repeats a stored one
/// (draft-ietf-httpapi-idempotency-key-header).
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How soon to come back after a store outage or an unfinished request.
pub(super) const SOON: Duration = Duration::from_secs(1);

pub(super) fn answer(verdict: Reply) -> Response {
    use StatusCode as S;
    match verdict {
        Reply::Stored { result, replayed } => stored(result, replayed),
        Reply::Accepted { key, replayed } => {
            let body = json!({ "status": "accepted", "idempotency_key": key });
            with_replayed((S::ACCEPTED, axum::Json(body)).into_response(), replayed)
        }
        Reply::InFlight { retry_after } => Problem::new(
            S::CONFLICT,
            "request-in-progress",
            "A request with this Idempotency-Key is still being processed",
            "retry with the same key and body after Retry-After seconds to get its result",
        )
        .retry_after(retry_after)
        .into_response(),
        Reply::LeaseLost { retry_after } => Problem::new(
            S::CONFLICT,
            "request-in-progress",
            "A request with this Idempotency-Key is being processed elsewhere",
            "this worker's hold on the key ended and another took it over; retry with the \
             same key to get the result",
        )
        .retry_after(retry_after)
        .into_response(),
        Reply::Conflict { first_route: None } => Problem::new(
            S::UNPROCESSABLE_ENTITY,
            "key-reused",
            "This Idempotency-Key was already used for a different request",
            "the body differs from the first request with this key in the fields that \
             define the operation; use a new key for a new operation",
        )
        .into_response(),
        Reply::Conflict {
            first_route: Some(first),
        } => Problem::new(
            S::UNPROCESSABLE_ENTITY,
            "key-reused",
            "This Idempotency-Key was already used on another endpoint",
            format!(
                "the key was first used on /v1/{first}; a key belongs to the endpoint it was \
                 first used on: use a new key for this one"
            ),
        )
        .into_response(),
        Reply::Invalid { detail, too_large } => Problem::new(
            if too_large {
                S::PAYLOAD_TOO_LARGE
            } else {
                S::BAD_REQUEST
            },
            "invalid-request",
            "The request is invalid; nothing was done",
            format!("{detail}; fix it and send it again with the same key"),
        )
        .into_response(),
        Reply::Released { retry_after } => Problem::new(
            S::SERVICE_UNAVAILABLE,
            "handler-unavailable",
            "The handler failed temporarily; nothing is stored",
            "retry with the same key after Retry-After seconds",
        )
        .retry_after(retry_after)
        .into_response(),
        Reply::Unknown { retry_after } => unknown(retry_after),
        Reply::Unavailable { detail } => Problem::new(
            S::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "The idempotency store is unavailable",
            detail,
        )
        .retry_after(SOON)
        .into_response(),
        Reply::Paused { retry_after } => Problem::new(
            S::SERVICE_UNAVAILABLE,
            "provider-unavailable",
            "The payment provider is in an outage; nothing was done",
            "intake is paused until the provider answers again; retry with the same key after \
             Retry-After seconds",
        )
        .retry_after(retry_after.max(SOON))
        .into_response(),
    }
}

fn unknown(retry_after: Option<Duration>) -> Response {
    let title = "The handler's outcome is unknown";
    match retry_after {
        Some(after) => Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "outcome-unknown",
            title,
            "the provider did not answer after the request was sent; a retry with the \
             same key sends it again with the same derived key, so it takes effect once",
        )
        .retry_after(after)
        .into_response(),
        None => Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "outcome-unknown",
            title,
            "every attempt ended without an answer; the key is held until an operator \
             reconciles it with the provider",
        )
        .into_response(),
    }
}

/// The stored status and body as they were stored. A stored failure with
/// no HTTP status (retries exhausted on connection errors) answers 502.
fn stored(result: StoredReply, replayed: bool) -> Response {
    let status = u16::try_from(result.status)
        .ok()
        .filter(|s| (200..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok());
    let response = match status {
        Some(status) => (
            status,
            [(header::CONTENT_TYPE, result.content_type.clone())],
            result.body,
        )
            .into_response(),
        None => Problem::new(
            StatusCode::BAD_GATEWAY,
            "handler-failed",
            "The handler failed on every attempt; this outcome is stored",
            format!("stored result: {}", String::from_utf8_lossy(&result.body)),
        )
        .into_response(),
    };
    with_replayed(response, replayed)
}

fn with_replayed(mut response: Response, replayed: bool) -> Response {
    if replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Nothing is served at this path.
pub(super) fn no_route(path: &str) -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "no-route",
        "No such route",
        format!("nothing is served at {path}: routes are POST /v1/<name> as configured"),
    )
    .into_response()
}

pub(super) fn method_not_allowed() -> Response {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Only POST is served here",
        "send the request with POST",
    )
    .with_header(header::ALLOW, "POST")
    .into_response()
}

pub(super) fn overloaded() -> Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "Too many requests in flight",
        "api.max_requests_in_flight requests are being handled; retry shortly",
    )
    .retry_after(SOON)
    .into_response()
}

/// The request took longer than `api.request_timeout` to arrive.
pub(super) fn body_timeout() -> Response {
    Problem::new(
        StatusCode::REQUEST_TIMEOUT,
        "request-timeout",
        "The request body did not arrive in time",
        "nothing was done; send it again with the same key",
    )
    .into_response()
}

/// The handler is still running past `api.request_timeout`; it keeps
/// running and stores its outcome.
pub(super) fn still_running() -> Response {
    Problem::new(
        StatusCode::GATEWAY_TIMEOUT,
        "still-running",
        "The request is still being processed",
        "its outcome will be stored; retry with the same key and body to get it",
    )
    .retry_after(SOON)
    .into_response()
}

pub(super) fn internal(detail: impl Into<String>) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "The request failed inside dedupq",
        detail,
    )
    .into_response()
}
