//! The work a claimed message triggers. Handlers see the derived key, which
//! is the same on every attempt; a handler that calls a provider must send
//! it as the provider's idempotency key.
//!
//! The built-in handler is [`HttpHandler`]. Work that is SQL in the database
//! holding the keys needs no provider key:
//! [`TransactionalHandler`](crate::engine::TransactionalHandler) runs it in
//! the claim's own transaction.

use crate::identity::{Epoch, Identity};
use crate::message::{Header, Source};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

/// The exact request of a payment: sent as is on every attempt.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The message's payload exactly as the first attempt received it.
    pub body: &'a [u8],
    /// The content type that came with that same payload, if any.
    pub content_type: Option<&'a str>,
}

/// Everything a handler may need about one claimed message.
#[derive(Debug)]
pub struct HandlerCall<'a> {
    /// The tenant and idempotency key this call settles.
    pub identity: &'a Identity,
    /// Send this as the provider's idempotency key: the same on every
    /// attempt (stored with the key at its first claim).
    pub derived_key: &'a str,
    /// The request to send: the payload of the attempt that created the
    /// key, byte for byte, even when a later copy of the message (whose
    /// excluded fields may differ) triggers a retry or takeover.
    pub request: Request<'a>,
    /// The headers of the delivery that triggered this attempt.
    pub headers: &'a [Header],
    /// 1 on the first claim, +1 on every takeover.
    pub attempt: u32,
    /// The fencing epoch of this claim.
    pub epoch: Epoch,
    /// The process holding the claim (engine.owner).
    pub owner: &'a str,
    /// When the current lease ends unless renewed (the engine renews it
    /// while the handler runs).
    pub lease_deadline: DateTime<Utc>,
    /// Where the delivery that triggered this attempt came from.
    pub source: &'a Source,
    /// An earlier attempt may have had its effect and no answer settled
    /// it: only an answer about that first request may settle the key (a
    /// success, or a definitive refusal); anything else keeps it unknown.
    pub uncertain: bool,
}

impl HandlerCall<'_> {
    /// The request body read as JSON into `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.request.body)
    }
}

/// A status and body, stored byte for byte and replayed to duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerResult {
    /// The answer's status code (the provider's HTTP status for `http`);
    /// the HTTP API answers with it, the first time and on every replay.
    pub status: i32,
    /// The answer's body.
    pub body: Vec<u8>,
    /// The body's content type, if known.
    pub content_type: Option<String>,
}

impl HandlerResult {
    /// A JSON result.
    pub fn json(status: i32, body: &serde_json::Value) -> Self {
        Self {
            status,
            body: body.to_string().into_bytes(),
            content_type: Some("application/json".into()),
        }
    }
}

/// What one handler run amounts to. The variant decides what is stored
/// for the key and what happens to the message; after an uncertain attempt
/// ([`HandlerCall::uncertain`]) a `Transient` answer counts as `Unknown`.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerOutcome {
    /// Done: stored and replayed.
    Success(HandlerResult),
    /// Failed for good (declined card, 4xx): stored and replayed, never retried.
    Permanent(HandlerResult),
    /// Nothing happened (the connection was refused, a 429, a 503 that
    /// says it was not processed): released and retried after backoff,
    /// honouring `retry_after`. When `engine.max_attempts` or
    /// `handler.retry_for` run out, the key is left free and the message
    /// dead-lettered (`exhausted_retries`): replaying it runs the payment.
    /// Never stored as failed: nothing was refused.
    Transient {
        /// The provider's status, if it answered at all.
        status: Option<i32>,
        /// What went wrong, for logs and the dead letter's detail.
        error: String,
        /// When the provider asked to be called again (`Retry-After`). A
        /// 429 or 503 with it pauses intake as a provider-wide outage.
        retry_after: Option<std::time::Duration>,
    },
    /// The request may have had its effect (a timeout after sending, a
    /// 500, 502, 504 or a 503 without `Retry-After`): retried with the same
    /// request and derived key until an answer settles it; when the
    /// attempts run out, held as unknown and dead-lettered
    /// (`outcome_unknown`) for an operator to settle. Never failed.
    Unknown {
        /// What went wrong, for logs and the dead letter's detail.
        error: String,
    },
    /// The answer says dedupq is misconfigured (a 401 after a key rotation,
    /// a 404 from a mistyped URL, a redirect, a certificate the provider
    /// and dedupq do not agree on): not the payment's outcome.
    /// Never stored; retried with backoff without using up an attempt;
    /// counted and reported on /readyz.
    Fault {
        /// The status that revealed the fault, if there was an answer.
        status: Option<i32>,
        /// Which kind of misconfiguration; the `reason` label of
        /// `dedupq_handler_faults_total`.
        reason: FaultReason,
        /// What went wrong, for the log.
        error: String,
    },
}

impl HandlerOutcome {
    /// The `result` label of `dedupq_handler_duration_seconds`, and the
    /// outcome of the handler's span.
    pub fn label(&self) -> &'static str {
        match self {
            HandlerOutcome::Success(_) => "success",
            HandlerOutcome::Permanent(_) => "permanent",
            HandlerOutcome::Transient { .. } => "transient",
            HandlerOutcome::Unknown { .. } => "unknown",
            HandlerOutcome::Fault { .. } => "fault",
        }
    }
}

/// Why a handler answer is a configuration fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultReason {
    /// 401: the provider does not accept dedupq's credentials.
    Unauthorized,
    /// 403: the credentials lack a permission.
    Forbidden,
    /// 404: the URL points at nothing.
    NotFound,
    /// 405: the URL does not take a POST.
    MethodNotAllowed,
    /// Any 3xx: the URL moved (redirects are never followed).
    Redirect,
    /// The TLS handshake was refused: the provider's certificate is not
    /// signed by a trusted CA (`handler.ca_file`), has expired or names
    /// another host, or the provider refused dedupq's client certificate
    /// (`handler.client_identity_file`). Nothing was sent.
    Tls,
    /// Another status listed in `handler.fault_statuses`.
    Other,
}

impl FaultReason {
    /// Every reason: the label values of `dedupq_handler_faults_total`.
    pub const ALL: [FaultReason; 7] = [
        FaultReason::Tls,
        FaultReason::Unauthorized,
        FaultReason::Forbidden,
        FaultReason::NotFound,
        FaultReason::MethodNotAllowed,
        FaultReason::Redirect,
        FaultReason::Other,
    ];

    /// The reason's label in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            FaultReason::Unauthorized => "unauthorized",
            FaultReason::Forbidden => "forbidden",
            FaultReason::NotFound => "not_found",
            FaultReason::MethodNotAllowed => "method_not_allowed",
            FaultReason::Redirect => "redirect",
            FaultReason::Tls => "tls",
            FaultReason::Other => "other",
        }
    }
}

/// The work a claimed message triggers. Called at most once at a time per
/// key, with the lease renewed while it runs. A run that panics, outlasts
/// `handler.timeout` or loses its lease counts as
/// [`HandlerOutcome::Unknown`]: the effect may have happened, so the next
/// attempt must send the same request with the same derived key.
///
/// A handler of one's own runs behind the same transports through
/// [`Application::build_with_handler`](crate::startup::Application::build_with_handler).
///
/// A handler that charges through a provider honouring `Idempotency-Key`:
///
/// ```no_run
/// use dedupq::handler::{FaultReason, Handler, HandlerCall, HandlerOutcome, HandlerResult};
///
/// struct Charge {
///     client: reqwest::Client,
/// }
///
/// #[async_trait::async_trait]
/// impl Handler for Charge {
///     async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
///         let sent = self
///             .client
///             .post("https://provider.example/v1/charges")
///             // The same on every attempt: the provider recognises a retry.
///             .header("Idempotency-Key", call.derived_key)
///             .header("Content-Type", "application/json")
///             .body(call.request.body.to_vec())
///             .send()
///             .await;
///         let response = match sent {
///             Ok(response) => response,
///             // Never sent: nothing happened.
///             Err(e) if e.is_connect() => {
///                 let error = e.to_string();
///                 let retry_after = None;
///                 return HandlerOutcome::Transient { status: None, error, retry_after };
///             }
///             // Sent, but no answer: the charge may have happened.
///             Err(e) => return HandlerOutcome::Unknown { error: e.to_string() },
///         };
///         let status = response.status().as_u16();
///         let Ok(body) = response.bytes().await else {
///             let error = format!("the answer ({status}) broke off");
///             return HandlerOutcome::Unknown { error };
///         };
///         let result = HandlerResult {
///             status: i32::from(status),
///             body: body.to_vec(),
///             content_type: Some("application/json".into()),
///         };
///         let error = format!("provider answered {status}");
///         match status {
///             200..=299 => HandlerOutcome::Success(result),
///             401 => HandlerOutcome::Fault {
///                 status: Some(result.status),
///                 reason: FaultReason::Unauthorized,
///                 error,
///             },
///             // Not processed: nothing happened.
///             409 | 429 => HandlerOutcome::Transient {
///                 status: Some(result.status),
///                 error,
///                 retry_after: None,
///             },
///             // The provider may have acted before it failed.
///             500..=599 => HandlerOutcome::Unknown { error },
///             _ => HandlerOutcome::Permanent(result),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Does the work for one claimed message and says how it went.
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome;
}

mod client;
mod http;
mod lookup;
mod reach;

pub use http::{HttpHandler, HttpHandlerError};
pub use reach::Reached;

use crate::config::{HandlerKind, HandlerSettings};
use std::sync::Arc;

/// The handler the configuration names, its `handler.lookup_url` checked
/// ([`HttpHandler::check_lookup`]). `payment` is `http` aimed at the
/// bundled provider simulator (`dedupq-provider`).
pub async fn from_settings(
    settings: &HandlerSettings,
) -> Result<Arc<dyn Handler>, HttpHandlerError> {
    if settings.url.is_empty() {
        // Only where nothing consumes payments (`Settings::validate_for_run`
        // refuses a transport without handler.url): an upkeep-only replica.
        return Ok(Arc::new(Unset));
    }
    match settings.kind {
        HandlerKind::Http | HandlerKind::Payment => {
            let handler = HttpHandler::new(settings)?;
            handler.check_lookup().await?;
            handler.watch_tls_files();
            Ok(Arc::new(handler))
        }
    }
}

/// The handler of a process that consumes nothing (no `handler.url`, no
/// transport): never called; were it called, nothing happened and the key
/// is left free.
struct Unset;

#[async_trait]
impl Handler for Unset {
    async fn handle(&self, _call: &HandlerCall<'_>) -> HandlerOutcome {
        HandlerOutcome::Transient {
            status: None,
            error: format!("handler.url {}", http::NO_URL),
            retry_after: None,
        }
    }
}
