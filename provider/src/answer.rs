//! The simulator's answers: charges (plain or odd), declines, errors, and
//! the statuses it can answer instead of charging.

use super::knobs::OddAnswer;
use super::ledger::Answer;
use axum::body::{Body, Bytes};
use axum::http::header::{
    ALLOW, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

const JSON: &str = "application/json";

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let content_type = HeaderValue::from_str(&self.content_type)
            .unwrap_or_else(|_| HeaderValue::from_static(JSON));
        (status, [(CONTENT_TYPE, content_type)], self.body).into_response()
    }
}

pub(crate) fn error(status: StatusCode, code: &str, detail: impl std::fmt::Display) -> Response {
    (
        status,
        Json(json!({ "error": code, "detail": detail.to_string() })),
    )
        .into_response()
}

/// The answer to a fresh charge: 201 with the charge (and a `receipt` of
/// `padding` bytes, if any), or an odd body.
pub(crate) fn charged(
    id: i64,
    body: &Value,
    key: Option<&str>,
    request_sha256: &str,
    odd: Option<OddAnswer>,
    padding: usize,
) -> Answer {
    let mut charge = json!({
        "id": format!("ch_{id}"),
        "status": "succeeded",
        "amount": body.get("amount"),
        "currency": body.get("currency"),
        "idempotency_key": key,
        "request_sha256": request_sha256,
    });
    if padding > 0 {
        charge["receipt"] = Value::String(receipt(id, padding));
    }
    if odd == Some(OddAnswer::NulEscape) {
        charge["note"] = Value::String("before\u{0}after".into());
    }
    let mut bytes = serde_json::to_vec(&charge).unwrap_or_default();
    if odd == Some(OddAnswer::RawBytes) {
        // Replace the closing brace: a string with a raw NUL and bytes that
        // are not UTF-8 (serde_json would escape or refuse them).
        bytes.pop();
        bytes.extend_from_slice(b",\"note\":\"before\x00\xff\xfeafter\"}");
    }
    Answer {
        status: 201,
        content_type: JSON.into(),
        body: bytes,
    }
}

/// `len` characters of the base64 alphabet from a generator seeded by the
/// charge: no run repeats often enough for PostgreSQL's compression to
/// shrink it much, so the stored answer takes about `len` bytes.
fn receipt(id: i64, len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = (id as u64) ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let n = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
            char::from(ALPHABET[(n >> 58) as usize])
        })
        .collect()
}

/// The answer to a declined card, kept and replayed as it was sent.
pub(crate) fn declined() -> Answer {
    let body = json!({ "error": "card_declined", "detail": "the card was declined" });
    Answer {
        status: 402,
        content_type: JSON.into(),
        body: serde_json::to_vec(&body).unwrap_or_default(),
    }
}

/// `answer` broken off: its status and headers with its whole length
/// declared, half its body, then an error that makes the server drop the
/// connection.
pub(crate) fn cut_off(answer: &Answer) -> Response {
    use futures::StreamExt;
    let half = Bytes::copy_from_slice(&answer.body[..answer.body.len() / 2]);
    let sent = futures::stream::once(async { Ok::<_, std::io::Error>(half) });
    // A moment later, so that the status, headers and half the body are
    // written before the connection drops.
    let broken = futures::stream::once(async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the answer breaks off here",
        ))
    });
    let mut response = answer.clone().into_response();
    *response.body_mut() = Body::from_stream(sent.chain(broken));
    response
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(answer.body.len()));
    response
}

/// The 5xx a request gets after it charged (`error_after_charge`).
pub(crate) fn after_charge_error(status: u16) -> Answer {
    let body = json!({ "error": "internal", "detail": "the provider failed after charging" });
    Answer {
        status,
        content_type: JSON.into(),
        body: serde_json::to_vec(&body).unwrap_or_default(),
    }
}

/// A status answered instead of charging: a redirect to the charge
/// listing (which a client that follows it turns into a GET, or a second
/// POST on 307/308), a configuration fault, or a rate limit (429), with
/// `Retry-After` when asked.
pub(crate) fn instead_of_charging(
    status: u16,
    retry_after: Option<u32>,
    request: &HeaderMap,
) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = error(
        code,
        &code_name(code),
        "answered by the simulator, nothing charged",
    );
    let headers = response.headers_mut();
    if code.is_redirection() {
        let location = match request.get("host").and_then(|h| h.to_str().ok()) {
            Some(host) => format!("http://{host}/charges"),
            None => "/charges".into(),
        };
        if let Ok(v) = HeaderValue::from_str(&location) {
            headers.insert(LOCATION, v);
        }
    }
    if let Some(seconds) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    match code {
        StatusCode::UNAUTHORIZED => {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            headers.insert(ALLOW, HeaderValue::from_static("GET"));
        }
        _ => {}
    }
    response
}

/// `moved_permanently`, `unauthorized`, … from the status's reason.
fn code_name(code: StatusCode) -> String {
    code.canonical_reason()
        .unwrap_or("answered")
        .to_ascii_lowercase()
        .replace(' ', "_")
}
