//! The work a claimed message triggers. Handlers see the derived key, which
//! is the same on every attempt; a handler that calls a provider must send
//! it as the provider's idempotency key.

use crate::identity::{Epoch, Identity};
use crate::message::Source;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

/// Everything a handler may need about one claimed message.
#[derive(Debug)]
pub struct HandlerCall<'a> {
    pub identity: &'a Identity,
    /// `tenant:key`: send this as the provider's idempotency key.
    pub derived_key: &'a str,
    pub body: &'a Value,
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
}

/// A status and JSON body, stored and replayed to duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerResult {
    pub status: i32,
    pub body: Value,
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
    /// with the same derived key, or reconciled by an operator.
    Unknown { error: String },
}

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
        HandlerKind::Http | HandlerKind::Payment => {
            Ok(Arc::new(HttpHandler::new(&settings.url, settings.timeout)?))
        }
    }
}
