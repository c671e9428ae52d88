//! `http`: POST the message's bytes, exactly as received, with the derived
//! key as the provider's idempotency key.
//!
//! 2xx: done. A definitive 4xx: failed for good. What says nothing
//! happened is transient: a refused connection (nothing was sent), a 429,
//! a 503 with `Retry-After` (not processed), a 408, a 409 (the provider
//! still works on this key). 422 is a refusal of the request on a first
//! attempt, but after an attempt whose outcome is unknown it is only the
//! provider noticing a repeat: it settles nothing. Any other 5xx (500,
//! 502, 504, a bare 503), a timeout or a broken connection after the
//! request was sent: unknown, because the provider may have acted (Stripe
//! documents that a 500 may follow a charge).
//! Redirects are never followed (reqwest would turn the POST into a GET and
//! drop the body) and, like 401/403/404/405, mean dedupq is misconfigured:
//! a fault, never the payment's outcome.

use super::client::SharedClient;
use super::lookup::Lookup;
use super::{FaultReason, Handler, HandlerCall, HandlerOutcome, HandlerResult};
use crate::config::{HandlerRoute, HandlerSettings};
use crate::message::Source;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Response, StatusCode};
use std::time::Duration;

/// Headers dedupq adds to every request, besides the derived key.
pub(super) mod header {
    /// The attempt number: 1 on the first claim, +1 on every takeover.
    pub(crate) const ATTEMPT: &str = "X-Dedupq-Attempt";
    /// The claim's fencing epoch.
    pub(crate) const EPOCH: &str = "X-Dedupq-Epoch";
    /// The process holding the claim (`engine.owner`).
    pub(crate) const OWNER: &str = "X-Dedupq-Owner";
    /// The message's tenant.
    pub(crate) const TENANT: &str = "X-Dedupq-Tenant";
    /// The message's own idempotency key (the derived key goes in
    /// `handler.key_header`).
    pub(crate) const KEY: &str = "X-Dedupq-Key";
}

/// The `http` handler: POSTs the message's bytes, exactly as received, to
/// `handler.url` (or the first matching `handler.routes` entry) with the
/// derived key in `handler.key_header`. Built once from `[handler]`; its
/// connection pool is shared by every call.
///
/// How answers become outcomes:
/// - 2xx: [`HandlerOutcome::Success`].
/// - 408, 409, 429, 503 with `Retry-After`, or a refused connection:
///   [`HandlerOutcome::Transient`] (with the `Retry-After` asked for).
/// - 500, 502, 504, a bare 503 and any other 5xx: [`HandlerOutcome::Unknown`]:
///   the provider may have acted before it failed.
/// - 422: [`HandlerOutcome::Permanent`] on a first attempt, like any other
///   4xx; after an uncertain attempt it is only the provider noticing a
///   repeat, so it settles nothing (transient).
/// - 3xx and `handler.fault_statuses` (401, 403, 404, 405 by default):
///   [`HandlerOutcome::Fault`]. Redirects are never followed: the POST would
///   turn into a GET without its body.
/// - A timeout or broken connection after sending:
///   [`HandlerOutcome::Unknown`], because the provider may have acted.
///
/// After an uncertain attempt, `handler.lookup_url` (when set) is asked
/// first whether the earlier request took effect; a 200 that names the
/// derived key settles the key as done without sending it again (see
/// `handler/lookup.rs`).
pub struct HttpHandler {
    pub(super) client: SharedClient,
    pub(super) url: reqwest::Url,
    pub(super) routes: Vec<(HandlerRoute, reqwest::Url)>,
    pub(super) lookup: Option<Lookup>,
    pub(super) timeout: Duration,
    key_header: HeaderName,
    pub(super) static_headers: HeaderMap,
    pass_headers: Vec<HeaderName>,
    fault_statuses: Vec<u16>,
    max_response_bytes: usize,
}

/// Why the `http` handler could not be built. Either stops dedupq at
/// startup: no message is claimed without a working handler.
#[derive(Debug, thiserror::Error)]
pub enum HttpHandlerError {
    /// A `[handler]` setting is unusable: a URL that is not http(s), a
    /// header name or value that is not valid, a CA or client identity file
    /// that cannot be read or parsed.
    #[error("invalid setting `handler.{setting}`: {problem}")]
    Config {
        /// The setting's name under `handler.`.
        setting: &'static str,
        /// What is wrong with it (never a secret header's value).
        problem: String,
    },
    /// reqwest could not build a client from these settings (its TLS
    /// setup failed).
    #[error("building the HTTP client failed")]
    Client(#[source] reqwest::Error),
}

/// Why an empty `handler.url` stops start-up, and the fix.
pub(crate) const NO_URL: &str = "is not set: payments would have nowhere to go; set \
    handler.url (or handler.url_file) to the provider's charge endpoint, e.g. \
    https://psp.example/v1/charges (the bundled simulator: http://127.0.0.1:8081/charges)";

fn config(setting: &'static str, problem: impl Into<String>) -> HttpHandlerError {
    HttpHandlerError::Config {
        setting,
        problem: problem.into(),
    }
}

fn parse_url(setting: &'static str, raw: &str) -> Result<reqwest::Url, HttpHandlerError> {
    reqwest::Url::parse(raw)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| {
            let shown = crate::config::redact_url(raw);
            config(setting, format!("'{shown}' is not a valid http(s) URL"))
        })
}

impl HttpHandler {
    /// Checks and resolves the settings (URLs, header names, secret header
    /// values, TLS files) and builds the client. Redirects are never
    /// followed.
    pub fn new(s: &HandlerSettings) -> Result<Self, HttpHandlerError> {
        if s.url.is_empty() {
            return Err(config("url", NO_URL));
        }
        let url = parse_url("url", &s.url)?;
        let routes = s
            .routes
            .iter()
            .map(|r| Ok((r.clone(), parse_url("routes", &r.url)?)))
            .collect::<Result<_, HttpHandlerError>>()?;
        if let Some(lookup) = &s.lookup_url {
            parse_url("lookup_url", &lookup.replace("{derived_key}", "k"))?;
        }
        let key_header = HeaderName::try_from(s.key_header.as_str())
            .map_err(|_| config("key_header", "is not a valid header name"))?;
        let mut static_headers = HeaderMap::new();
        for (name, value) in &s.headers {
            let header = HeaderName::try_from(name.as_str())
                .map_err(|_| config("headers", format!("'{name}' is not a valid header name")))?;
            // The problem names the file or variable, never the value.
            let raw = value
                .resolve()
                .map_err(|problem| config("headers", format!("'{name}': {problem}")))?;
            let mut value = HeaderValue::try_from(raw).map_err(|_| {
                config(
                    "headers",
                    format!("the value of '{name}' is not a valid header value"),
                )
            })?;
            value.set_sensitive(true);
            static_headers.insert(header, value);
        }
        let pass_headers = s
            .pass_headers
            .iter()
            .map(|n| {
                HeaderName::try_from(n.as_str())
                    .map_err(|_| config("pass_headers", format!("'{n}' is not a header name")))
            })
            .collect::<Result<_, _>>()?;
        let client = SharedClient::new(s)?;
        let lookup = Lookup::new(s, &client, &static_headers);
        Ok(Self {
            client,
            url,
            routes,
            lookup,
            timeout: s.timeout,
            key_header,
            static_headers,
            pass_headers,
            fault_statuses: s.fault_statuses.clone(),
            max_response_bytes: s.max_response_bytes,
        })
    }

    /// Reads `handler.ca_file` and `handler.client_identity_file` again
    /// when they change (checked every 2 s, and on SIGHUP), for as long as
    /// this handler lives: a rotated certificate needs no restart.
    pub fn watch_tls_files(&self) {
        self.client.watch();
    }

    fn target(&self, call: &HandlerCall<'_>) -> &reqwest::Url {
        let source = match call.source {
            Source::Kafka { topic, .. } => Some(topic.as_str()),
            Source::Amqp { queue, .. } => Some(queue.as_str()),
            Source::Http { route, .. } => Some(route.as_str()),
            _ => None,
        };
        let tenant = call.identity.tenant.as_str();
        self.routes
            .iter()
            .find(|(r, _)| {
                r.source.as_deref().is_none_or(|s| Some(s) == source)
                    && r.tenant.as_deref().is_none_or(|t| t == tenant)
            })
            .map_or(&self.url, |(_, url)| url)
    }

    fn request_headers(&self, call: &HandlerCall<'_>) -> HeaderMap {
        let mut h = HeaderMap::new();
        for name in &self.pass_headers {
            for header in call.headers.iter().filter(|m| m.is(name.as_str())) {
                if let Some(v) = header
                    .value
                    .as_deref()
                    .and_then(|v| HeaderValue::from_bytes(v).ok())
                {
                    h.append(name.clone(), v);
                }
            }
        }
        // While traced, the provider continues this handler call's span,
        // not the producer's: the passed context is replaced.
        if !crate::broken::is(crate::broken::Break::NoTracePropagation) {
            crate::telemetry::inject_current(&mut h);
        }
        h.extend(self.static_headers.clone());
        let text = |v: &str| {
            HeaderValue::from_str(v).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
        };
        h.insert(self.key_header.clone(), text(call.derived_key));
        h.insert(header::ATTEMPT, text(&call.attempt.to_string()));
        h.insert(header::EPOCH, text(&call.epoch.to_string()));
        h.insert(header::OWNER, text(call.owner));
        h.insert(header::TENANT, text(call.identity.tenant.as_str()));
        h.insert(header::KEY, text(call.identity.key.as_str()));
        let content_type = call
            .request
            .content_type
            .and_then(|c| HeaderValue::from_str(c).ok())
            .unwrap_or_else(|| HeaderValue::from_static("application/json"));
        h.insert(CONTENT_TYPE, content_type);
        h
    }

    /// The answer's status and body; a body over `max_response_bytes` is
    /// not stored (the status is).
    async fn read(&self, response: Response) -> Result<HandlerResult, reqwest::Error> {
        let status = i32::from(response.status().as_u16());
        let limit = self.max_response_bytes;
        Ok(match read_answer(response, limit).await? {
            Some(result) => result,
            None => {
                tracing::warn!(
                    status,
                    limit,
                    "provider answer too long; its body is not stored"
                );
                HandlerResult {
                    status,
                    body: Vec::new(),
                    content_type: None,
                }
            }
        })
    }

    fn classify(
        &self,
        uncertain: bool,
        result: HandlerResult,
        retry_after: Option<Duration>,
    ) -> HandlerOutcome {
        let status = StatusCode::from_u16(result.status as u16).unwrap_or(StatusCode::BAD_GATEWAY);
        let code = status.as_u16();
        let summary = || {
            let text = String::from_utf8_lossy(&result.body);
            let text: String = text.chars().take(200).collect();
            format!("provider answered {status}: {text}")
        };
        if status.is_success() {
            return HandlerOutcome::Success(result);
        }
        let fault = |reason| HandlerOutcome::Fault {
            status: Some(result.status),
            reason,
            error: summary(),
        };
        if status.is_redirection() {
            return fault(FaultReason::Redirect);
        }
        if self.fault_statuses.contains(&code) {
            return fault(match code {
                401 => FaultReason::Unauthorized,
                403 => FaultReason::Forbidden,
                404 => FaultReason::NotFound,
                405 => FaultReason::MethodNotAllowed,
                _ => FaultReason::Other,
            });
        }
        // Answers that say the request was not processed.
        let not_processed = matches!(code, 408 | 409 | 429)
            || (code == 503 && retry_after.is_some())
            || (uncertain && code == 422);
        if not_processed {
            return HandlerOutcome::Transient {
                status: Some(result.status),
                error: summary(),
                retry_after,
            };
        }
        if status.is_client_error() {
            return HandlerOutcome::Permanent(result);
        }
        // A 5xx (or an odd status) after the request arrived: it may have
        // been processed before the failure.
        HandlerOutcome::Unknown { error: summary() }
    }
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        if let Some(lookup) = self.lookup.as_ref().filter(|_| call.uncertain) {
            if let Some(settled) = lookup.ask(call).await {
                return settled;
            }
        }
        let sent = self
            .client
            .get()
            .post(self.target(call).clone())
            .timeout(self.timeout)
            .headers(self.request_headers(call))
            .body(call.request.body.to_vec())
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // The error text never carries the URL: it may hold credentials.
            // A refused handshake is configuration (a CA or client
            // certificate to rotate), not the provider being away: it uses
            // no attempt and waits for the fix.
            Err(e) if e.is_connect() && tls_refused(&e) => {
                return HandlerOutcome::Fault {
                    status: None,
                    reason: FaultReason::Tls,
                    error: format!(
                        "the TLS handshake with the provider failed (handler.ca_file, \
                         handler.client_identity_file): {}",
                        crate::telemetry::chain(&e.without_url())
                    ),
                }
            }
            Err(e) if e.is_connect() => {
                return HandlerOutcome::Transient {
                    status: None,
                    error: format!("connecting to the provider failed: {}", e.without_url()),
                    retry_after: None,
                }
            }
            Err(e) => {
                return HandlerOutcome::Unknown {
                    error: format!("no answer after sending the request: {}", e.without_url()),
                }
            }
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        match self.read(response).await {
            Ok(result) => self.classify(call.uncertain, result, retry_after),
            // The answer broke off (the connection dropped, or the timeout
            // ran out, part-way through its body). Even a 2xx is not stored
            // so: its body (the charge's id) is lost, and a client replayed
            // an empty success could not reconcile it. The provider may
            // have acted, so the key is unknown; the retry with the same
            // derived key (or `handler.lookup_url`) gets the whole answer.
            Err(e) => HandlerOutcome::Unknown {
                error: format!("the answer ({status}) broke off: {}", e.without_url()),
            },
        }
    }
}

/// A provider's answer: its status, `Content-Type` and body; None once the
/// body runs past `limit` bytes (read no further).
pub(super) async fn read_answer(
    mut response: Response,
    limit: usize,
) -> Result<Option<HandlerResult>, reqwest::Error> {
    let status = i32::from(response.status().as_u16());
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(HandlerResult {
        status,
        body,
        content_type,
    }))
}

/// Whether a connection failed in its TLS handshake (rustls refused the
/// provider's certificate, or the provider sent an alert refusing ours),
/// not on the network.
fn tls_refused(e: &reqwest::Error) -> bool {
    use tokio_rustls::rustls;
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = link {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        // An io::Error hides the error it wraps from `source()` (and the
        // connector wraps rustls's error in two of them).
        link = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    false
}

/// `Retry-After` as delta-seconds or an HTTP date; None if absent or
/// unreadable (an unreadable one says nothing about the request).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(
        (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(uncertain: bool, code: u16) -> &'static str {
        kind_with(uncertain, code, None)
    }

    fn kind_with(uncertain: bool, code: u16, retry_after: Option<Duration>) -> &'static str {
        let settings = HandlerSettings {
            url: "http://127.0.0.1:9/charges".into(),
            ..HandlerSettings::default()
        };
        let h = HttpHandler::new(&settings).unwrap();
        let result = HandlerResult {
            status: i32::from(code),
            body: b"{}".to_vec(),
            content_type: None,
        };
        h.classify(uncertain, result, retry_after).label()
    }

    #[test]
    fn status_codes_map_to_outcomes() {
        for (code, first, after_unknown) in [
            (200, "success", "success"),
            (201, "success", "success"),
            (400, "permanent", "permanent"),
            (402, "permanent", "permanent"),
            (422, "permanent", "transient"),
            (408, "transient", "transient"),
            (409, "transient", "transient"),
            (429, "transient", "transient"),
            (500, "unknown", "unknown"),
            (502, "unknown", "unknown"),
            (503, "unknown", "unknown"),
            (504, "unknown", "unknown"),
            (301, "fault", "fault"),
            (302, "fault", "fault"),
            (307, "fault", "fault"),
            (401, "fault", "fault"),
            (403, "fault", "fault"),
            (404, "fault", "fault"),
            (405, "fault", "fault"),
        ] {
            assert_eq!(kind(false, code), first, "{code} on a first attempt");
            assert_eq!(
                kind(true, code),
                after_unknown,
                "{code} after an unknown attempt"
            );
        }
        let asked = Some(Duration::from_secs(3));
        assert_eq!(
            kind_with(false, 503, asked),
            "transient",
            "503 not processed"
        );
        assert_eq!(kind_with(false, 429, asked), "transient");
        assert_eq!(
            kind_with(false, 500, asked),
            "unknown",
            "a 500 may follow a charge"
        );
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(
            retry_after(&h),
            Some(Duration::ZERO),
            "a date in the past: at once"
        );
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("soon"),
        );
        assert_eq!(retry_after(&h), None);
    }
}
