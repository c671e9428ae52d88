//! `POST /charges`: charge once per Idempotency-Key, as a Stripe-like
//! provider does: a repeat replays the first answer, a repeat while the
//! first request runs gets 409, a repeat with another body gets 422.

use super::answer::{self, error};
use super::api::AppState;
use super::canonical::{hex, write_canonical};
use super::knobs::{AfterCharge, Compare, Fate, Knobs, OddAnswer};
use super::ledger::{Answer, Caller, Existing, Ledger, Received};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The card number that is always declined (as in common provider test suites).
pub const DECLINED_CARD: &str = "4000000000000002";

fn internal(e: sqlx::Error) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable", e)
}

fn canonical_hash(body: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(body, &mut canonical);
    hex(&Sha256::digest(canonical.as_bytes()))
}

pub(super) async fn create_charge(
    State(s): State<AppState>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let body: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_json", e),
    };
    let (fate, knobs) = {
        let mut k = s.knobs.lock().unwrap_or_else(|e| e.into_inner());
        (k.draw(), k.clone())
    };
    if fate.fail {
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected failure, nothing charged",
        );
        if knobs.fail_retry_after {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        return response;
    }
    if let Some(status) = fate.status_instead {
        return answer::instead_of_charging(status, knobs.answer_retry_after, &headers);
    }
    if fate.hang_before_charge {
        std::future::pending::<()>().await;
    }
    let ledger = s.ledger.clone();
    let charging = charge(s, headers, raw, body, fate, knobs);
    let reply = if fate.after_charge == AfterCharge::Hang {
        // Runs in the request: the charge completes once its caller hangs
        // up (see `finish`).
        charging.await
    } else {
        // Spawned: a request received is carried out even if its caller
        // hangs up meanwhile, as a real provider's is. In the request, a
        // hang-up while the charge was being recorded dropped it half done:
        // recorded, never completed, answering every retry 409.
        match tokio::spawn(charging).await {
            Ok(reply) => reply,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "charge_task", e),
        }
    };
    // Back in the request, so only while its caller is still there.
    if let Some(id) = reply.delivers {
        if let Err(e) = ledger.mark_answered(id).await {
            return internal(e);
        }
    }
    reply.response
}

/// An answer, and the charge whose answer it delivers (noted as answered
/// once it is sent).
struct Reply {
    response: Response,
    delivers: Option<i64>,
}

impl From<Response> for Reply {
    fn from(response: Response) -> Self {
        Self {
            response,
            delivers: None,
        }
    }
}

/// Records the charge (or finds the key's earlier one) and answers as
/// `fate` says.
async fn charge(
    s: AppState,
    headers: HeaderMap,
    raw: Bytes,
    body: Value,
    fate: Fate,
    knobs: Knobs,
) -> Reply {
    let received = receive(&headers, &raw, &body);
    let key = received.caller.key;
    let card = body.get("card").and_then(Value::as_str);
    let declined = (fate.decline || card == Some(DECLINED_CARD)).then(answer::declined);
    let id = match (key, knobs.honour_keys) {
        (Some(key), true) => match s
            .ledger
            .charge_once(key, &received, declined.as_ref())
            .await
        {
            Ok(Ok(id)) => id,
            Ok(Err(existing)) => return repeat(existing, &received, knobs.compare).into(),
            Err(e) => return internal(e).into(),
        },
        _ => match s.ledger.charge_always(&received, declined.as_ref()).await {
            Ok(id) => id,
            Err(e) => return internal(e).into(),
        },
    };
    if let Some(declined) = declined {
        return declined.into_response().into();
    }
    let answer = answer::charged(
        id,
        &body,
        key,
        &received.request_hash,
        fate.odd_answer,
        knobs.answer_padding,
    );
    if fate.error_after_charge {
        let failed = answer::after_charge_error(knobs.error_after_charge_status);
        let kept = if knobs.error_after_charge_replay {
            failed.clone()
        } else {
            answer
        };
        // The charge completes (and is what a repeat replays, or the error
        // itself); this request is told it failed.
        let delivers = finish(&s.ledger, id, kept, &fate, &knobs).await.delivers;
        return Reply {
            response: failed.into_response(),
            delivers,
        };
    }
    if fate.odd_answer == Some(OddAnswer::CutBody) {
        // The charge completes with its whole answer (a repeat replays it);
        // this request's answer breaks off, so it is not noted as answered.
        let cut = answer::cut_off(&answer);
        let finished = finish(&s.ledger, id, answer, &fate, &knobs).await;
        if finished.delivers.is_none() {
            // The charge did not complete: its error is the answer.
            return finished;
        }
        return cut.into();
    }
    finish(&s.ledger, id, answer, &fate, &knobs).await
}

/// The request as the ledger records it.
fn receive<'a>(headers: &'a HeaderMap, raw: &'a [u8], body: &Value) -> Received<'a> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = header("idempotency-key");
    Received {
        caller: Caller {
            key,
            tenant: key.and_then(|k| k.split_once(':')).map(|(t, _)| t),
            owner: header("x-dedupq-owner"),
            attempt: header("x-dedupq-attempt").and_then(|a| a.parse().ok()),
            epoch: header("x-dedupq-epoch").and_then(|e| e.parse().ok()),
        },
        bytes: raw,
        content_type: header("content-type"),
        body_hash: canonical_hash(body),
        request_hash: hex(&Sha256::digest(raw)),
        payment_id: body.get("payment_id").and_then(payment_id),
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
    }
}

fn payment_id(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The answer to a key seen before.
fn repeat(existing: Existing, received: &Received<'_>, compare: Compare) -> Response {
    match existing {
        Existing::Pending => error(
            StatusCode::CONFLICT,
            "in_progress",
            "a request with this key is still running",
        ),
        Existing::Finished {
            body_hash,
            request_hash,
            answer,
        } => {
            let same = match compare {
                Compare::Json => body_hash == received.body_hash,
                Compare::Bytes => request_hash == received.request_hash,
            };
            if !same {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    "this key was used with a different body",
                );
            }
            let mut response = answer.into_response();
            response.headers_mut().insert(
                "idempotent-replayed",
                "true".parse().expect("a header value"),
            );
            response
        }
    }
}

/// Completes a recorded charge and answers, as the fate says. The key
/// counts as running (409 to a repeat) until the charge completes.
async fn finish(ledger: &Ledger, id: i64, answer: Answer, fate: &Fate, knobs: &Knobs) -> Reply {
    let wait = match fate.after_charge {
        AfterCharge::Answer => knobs.latency,
        AfterCharge::Slow(d) => knobs.latency + d,
        AfterCharge::Hang => {
            // Running while the caller waits; once it hangs up (this future
            // is dropped) the charge completes, as a provider finishes an
            // operation whose client left.
            let _complete = CompleteOnDrop {
                ledger: ledger.clone(),
                id,
                answer: Some(answer),
            };
            return std::future::pending::<Reply>().await;
        }
    };
    // Spawned: a charge, once recorded, completes even if the caller hangs
    // up (as a real provider's does); otherwise it would stay running and
    // answer every retry with 409.
    let completing = {
        let (ledger, answer) = (ledger.clone(), answer.clone());
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            complete(&ledger, id, &answer).await;
        })
    };
    if let Err(e) = completing.await {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "charge_task", e).into();
    }
    Reply {
        response: answer.into_response(),
        delivers: Some(id),
    }
}

struct CompleteOnDrop {
    ledger: Ledger,
    id: i64,
    answer: Option<Answer>,
}

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        let (Some(answer), Ok(runtime)) =
            (self.answer.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let (ledger, id) = (self.ledger.clone(), self.id);
        runtime.spawn(async move { complete(&ledger, id, &answer).await });
    }
}

/// Marks a recorded charge succeeded, trying again while the ledger's
/// database cannot be written (restarting, refusing connections): a charge
/// that was made completes, as a real provider's does, instead of staying
/// running and answering every repeat 409 for good.
async fn complete(ledger: &Ledger, id: i64, answer: &Answer) {
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        match ledger.succeed(id, answer).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, id, ?wait, "completing a charge failed; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}
