//! Turning a delivery into an identity, a fingerprint and a JSON body (or
//! a reason it is invalid).

use crate::config::{IdentitySettings, TenantSource};
use crate::fingerprint::{Fingerprint, FingerprintSpec};
use crate::identity::{IdempotencyKey, Identity, IdentityError, Tenant};
pub use crate::message::{Incoming, Source};
use serde_json::Value;

/// Why a message cannot be processed at all. It is dead-lettered and never
/// claims a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReason {
    #[error("body is {len} bytes; the limit is {max}")]
    TooLarge { len: usize, max: usize },
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("body is JSON but not an object")]
    NotObject,
    #[error("tenant: {0}")]
    Tenant(IdentityError),
    #[error("idempotency key: {0}")]
    Key(IdentityError),
}

impl InvalidReason {
    /// Low-cardinality label for metrics and dead-letter headers.
    pub fn label(&self) -> &'static str {
        match self {
            InvalidReason::TooLarge { .. } => "too_large",
            InvalidReason::NotJson(_) | InvalidReason::NotObject => "not_json",
            InvalidReason::Tenant(_) => "bad_tenant",
            InvalidReason::Key(_) => "bad_key",
        }
    }
}

/// A valid message, ready to claim.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub identity: Identity,
    pub fingerprint: Fingerprint,
    pub body: Value,
}

/// Applies the identity rules of the configuration to deliveries.
#[derive(Debug, Clone)]
pub struct Parser {
    tenant: TenantSource,
    key_header: String,
    key_pointer: Option<String>,
    max_body_bytes: usize,
    fingerprint: FingerprintSpec,
}

impl Parser {
    pub fn new(settings: &IdentitySettings) -> Self {
        Self {
            tenant: settings.tenant.clone(),
            key_header: settings.key_header.clone(),
            key_pointer: settings.key_pointer.clone(),
            max_body_bytes: settings.max_body_bytes,
            fingerprint: settings.fingerprint.clone(),
        }
    }

    /// The header the idempotency key is read from.
    pub fn key_header(&self) -> &str {
        &self.key_header
    }

    pub fn parse(&self, msg: &Incoming) -> Result<Parsed, InvalidReason> {
        if msg.body.len() > self.max_body_bytes {
            return Err(InvalidReason::TooLarge {
                len: msg.body.len(),
                max: self.max_body_bytes,
            });
        }
        let body: Value =
            serde_json::from_slice(&msg.body).map_err(|e| InvalidReason::NotJson(e.to_string()))?;
        if !body.is_object() {
            return Err(InvalidReason::NotObject);
        }
        let tenant = match &self.tenant {
            TenantSource::Header { name } => Tenant::parse(msg.header(name).unwrap_or_default()),
            TenantSource::Fixed { tenant } => Tenant::parse(tenant.as_bytes()),
            TenantSource::Body { pointer } => Tenant::parse(text_at(&body, pointer)),
        }
        .map_err(InvalidReason::Tenant)?;
        let key_bytes = match (msg.header(&self.key_header), &self.key_pointer) {
            (Some(raw), _) => raw,
            (None, Some(pointer)) => text_at(&body, pointer),
            (None, None) => &[],
        };
        let key = IdempotencyKey::parse(key_bytes).map_err(InvalidReason::Key)?;
        let fingerprint = self.fingerprint.fingerprint(&body);
        Ok(Parsed {
            identity: Identity { tenant, key },
            fingerprint,
            body,
        })
    }
}

fn text_at<'a>(body: &'a Value, pointer: &str) -> &'a [u8] {
    body.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::as_bytes)
        .unwrap_or_default()
}
