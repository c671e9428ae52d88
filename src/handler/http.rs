//! `http`: POST the body to a URL with the derived key as `Idempotency-Key`.
//!
//! 2xx: done. 4xx except 408/409/429: failed for good. 5xx, 408, 409 (the
//! provider is still working on this key), 429 and refused connections:
//! transient. A timeout or a broken connection after the request was sent:
//! unknown, because the provider may have acted.

use super::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

pub struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpHandlerError {
    #[error("handler.url '{0}' is not a valid http(s) URL")]
    BadUrl(String),
    #[error("building the HTTP client failed")]
    Client(#[source] reqwest::Error),
}

impl HttpHandler {
    pub fn new(url: &str, timeout: Duration) -> Result<Self, HttpHandlerError> {
        let url = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| HttpHandlerError::BadUrl(url.to_string()))?;
        let client = reqwest::Client::builder()
            // Refused or unreachable is told apart from a slow provider:
            // connecting is bounded on its own, well inside the timeout.
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            // Keep connections warm for the next messages of the batch.
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .map_err(HttpHandlerError::Client)?;
        Ok(Self {
            client,
            url,
            timeout,
        })
    }
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        let sent = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header("Idempotency-Key", call.derived_key)
            .header("X-Dedupq-Attempt", call.attempt.to_string())
            .header("X-Dedupq-Epoch", call.epoch.to_string())
            .header("X-Dedupq-Owner", call.owner)
            .json(call.body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return HandlerOutcome::Transient {
                    status: None,
                    error: format!("connecting to the provider failed: {e}"),
                }
            }
            Err(e) => {
                return HandlerOutcome::Unknown {
                    error: format!("no answer after sending the request: {e}"),
                }
            }
        };
        let status = response.status();
        let body = match response.bytes().await {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) })),
            Err(e) if status.is_success() => json!({ "unread_body": e.to_string() }),
            Err(e) => Value::String(e.to_string()),
        };
        classify(status, body)
    }
}

fn classify(status: StatusCode, body: Value) -> HandlerOutcome {
    let result = HandlerResult {
        status: i32::from(status.as_u16()),
        body,
    };
    let retryable = matches!(
        status,
        StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS
    );
    if status.is_success() {
        HandlerOutcome::Success(result)
    } else if status.is_server_error() || retryable {
        HandlerOutcome::Transient {
            status: Some(result.status),
            error: format!("provider answered {status}: {}", result.body),
        }
    } else {
        HandlerOutcome::Permanent(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_outcomes() {
        let kind = |code: u16| match classify(StatusCode::from_u16(code).unwrap(), Value::Null) {
            HandlerOutcome::Success(_) => "success",
            HandlerOutcome::Permanent(_) => "permanent",
            HandlerOutcome::Transient { .. } => "transient",
            HandlerOutcome::Unknown { .. } => "unknown",
        };
        assert_eq!(kind(200), "success");
        assert_eq!(kind(201), "success");
        assert_eq!(kind(400), "permanent");
        assert_eq!(kind(402), "permanent");
        assert_eq!(kind(422), "permanent");
        assert_eq!(kind(408), "transient");
        assert_eq!(kind(409), "transient");
        assert_eq!(kind(429), "transient");
        assert_eq!(kind(500), "transient");
        assert_eq!(kind(503), "transient");
    }
}
