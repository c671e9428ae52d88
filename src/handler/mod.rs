//! The work a claimed message triggers. Handlers see the derived key, which
//! is the same on every attempt; a handler that calls a provider must send
//! it as the provider's idempotency key.

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
    pub content_type: Option<&'a str>,
}

/// Everything a handler may need about one claimed message.
#[derive(Debug)]
pub struct HandlerCall<'a> {
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
    pub status: i32,
    pub body: Vec<u8>,
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

#[derive(Debug, Clone, PartialEq)]
pub enum HandlerOutcome {
    /// Done: stored and replayed.
    Success(HandlerResult),
    /// Failed for good (declined card, 4xx): stored and replayed, never retried.
    Permanent(HandlerResult),
    /// Nothing happened (5xx, refused): retried after backoff.
    Transient { status: Option<i32>, error: String },
    /// The request may have had its effect (timeout after sending): retried
    /// with the same request and derived key, or settled by an operator.
    Unknown { error: String },
    /// The answer says dedupq is misconfigured (a 401 after a key rotation,
    /// a 404 from a mistyped URL, a redirect): not the payment's outcome.
    /// Never stored; retried with backoff without using up an attempt;
    /// counted and reported on /readyz.
    Fault {
        status: Option<i32>,
        reason: FaultReason,
        error: String,
    },
}

/// Why a handler answer is a configuration fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultReason {
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Redirect,
    /// Another status listed in `handler.fault_statuses`.
    Other,
}

impl FaultReason {
    pub const ALL: [FaultReason; 6] = [
        FaultReason::Unauthorized,
        FaultReason::Forbidden,
        FaultReason::NotFound,
        FaultReason::MethodNotAllowed,
        FaultReason::Redirect,
        FaultReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FaultReason::Unauthorized => "unauthorized",
            FaultReason::Forbidden => "forbidden",
            FaultReason::NotFound => "not_found",
            FaultReason::MethodNotAllowed => "method_not_allowed",
            FaultReason::Redirect => "redirect",
            FaultReason::Other => "other",
        }
    }
}

/// The work a claimed message triggers. Called at most once at a time per
/// key, with the lease renewed while it runs.
///
/// ```
/// use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
///
/// struct Ledger;
///
/// #[async_trait::async_trait]
/// impl Handler for Ledger {
///     async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
///         let Ok(order) = call.json::<serde_json::Value>() else {
///             let body = serde_json::json!({"error": "not an order"});
///             return HandlerOutcome::Permanent(HandlerResult::json(400, &body));
///         };
///         // ... call the provider with `call.derived_key` as its idempotency key ...
///         HandlerOutcome::Success(HandlerResult::json(200, &order))
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome;
}

mod http;

pub use http::{HttpHandler, HttpHandlerError};

use crate::config::{HandlerKind, HandlerSettings};
use std::sync::Arc;

/// The handler the configuration names. `payment` is `http` aimed at the
/// bundled provider simulator (`dedupq provider`).
pub fn from_settings(settings: &HandlerSettings) -> Result<Arc<dyn Handler>, HttpHandlerError> {
    match settings.kind {
        HandlerKind::Http | HandlerKind::Payment => Ok(Arc::new(HttpHandler::new(settings)?)),
    }
}
