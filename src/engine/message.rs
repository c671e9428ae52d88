//! Turning a delivery into an identity, a fingerprint and a JSON body (or
//! a reason it is invalid).

use crate::config::{IdentitySettings, TenantSource};
use crate::fingerprint::{Fingerprint, FingerprintSpec};
use crate::identity::{DerivedKeyFormat, IdempotencyKey, Identity, IdentityError, Tenant};
use crate::json::{self, Json, JsonError};
pub use crate::message::{Header, Incoming, Source, Transport};
use std::sync::Arc;

/// Why a message cannot be processed at all. It is dead-lettered and never
/// claims a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReason {
    /// The body is longer than `identity.max_body_bytes` (`too_large`).
    #[error("body is {len} bytes; the limit is {max}")]
    TooLarge {
        /// The body's length in bytes.
        len: usize,
        /// The limit, `identity.max_body_bytes`.
        max: usize,
    },
    /// The body is not JSON (`not_json`).
    #[error("body is not JSON: {0}")]
    NotJson(JsonError),
    /// The body is JSON, but not an object (`not_json`).
    #[error("body is JSON but not an object")]
    NotObject,
    /// An object in the body names a member twice, which two parsers could
    /// read as two different payments (`duplicate_member`).
    #[error("ambiguous body: {0}")]
    DuplicateMember(JsonError),
    /// A header name is not UTF-8 (`bad_header`).
    #[error("a header name is not UTF-8: {name}")]
    BadHeader {
        /// The name, its invalid bytes replaced by U+FFFD.
        name: String,
    },
    /// The key or tenant header appears more than once
    /// (`duplicate_header`).
    #[error("header '{name}' appears {count} times: which one names the payment is ambiguous")]
    DuplicateHeader {
        /// The header, as configured.
        name: String,
        /// How often the message carries it.
        count: usize,
    },
    /// The tenant is missing or not valid (`bad_tenant`).
    #[error("tenant: {0}")]
    Tenant(IdentityError),
    /// The idempotency key is missing or not valid (`bad_key`).
    #[error("idempotency key: {0}")]
    Key(IdentityError),
}

impl InvalidReason {
    /// Low-cardinality label for metrics and dead-letter headers.
    pub fn label(&self) -> &'static str {
        match self {
            InvalidReason::TooLarge { .. } => "too_large",
            InvalidReason::NotJson(_) | InvalidReason::NotObject => "not_json",
            InvalidReason::DuplicateMember(_) => "duplicate_member",
            InvalidReason::BadHeader { .. } => "bad_header",
            InvalidReason::DuplicateHeader { .. } => "duplicate_header",
            InvalidReason::Tenant(_) => "bad_tenant",
            InvalidReason::Key(_) => "bad_key",
        }
    }

    /// Every label [`InvalidReason::label`] gives, for the dead-letter
    /// counters that exist from start-up.
    pub const LABELS: [&'static str; 7] = [
        "too_large",
        "not_json",
        "duplicate_member",
        "bad_header",
        "duplicate_header",
        "bad_tenant",
        "bad_key",
    ];
}

/// A valid message, ready to claim.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The tenant and the idempotency key.
    pub identity: Identity,
    /// The fingerprint of the operation, compared with the stored one when
    /// the key exists.
    pub fingerprint: Fingerprint,
    /// The key sent to the provider, if this message's claim creates the key.
    pub derived_key: String,
    /// The HTTP route the key belongs to: the route of a sync request, or
    /// the route an async request was accepted on (the `dedupq-route`
    /// header it is published with). None for other queue messages, which
    /// share every route's keys.
    pub route: Option<String>,
}

/// The header an async route's message carries its route in.
pub const ROUTE_HEADER: &str = "dedupq-route";

/// Applies the identity rules of the configuration to deliveries.
#[derive(Debug, Clone)]
pub struct Parser {
    tenant: TenantSource,
    key_header: String,
    key_pointer: Option<String>,
    max_body_bytes: usize,
    fingerprint: Arc<FingerprintSpec>,
    derived_key: DerivedKeyFormat,
}

impl Parser {
    /// The settings must have passed `Settings::validate`.
    pub fn new(settings: &IdentitySettings) -> Self {
        Self {
            tenant: settings.tenant.clone(),
            key_header: settings.key_header.clone(),
            key_pointer: settings.key_pointer.clone(),
            max_body_bytes: settings.max_body_bytes,
            fingerprint: Arc::new(settings.fingerprint.clone()),
            derived_key: DerivedKeyFormat::parse(&settings.derived_key)
                .unwrap_or(DerivedKeyFormat::Plain),
        }
    }

    /// The header the idempotency key is read from.
    pub fn key_header(&self) -> &str {
        &self.key_header
    }

    /// The header the tenant is read from, when it comes from a header.
    pub fn tenant_header(&self) -> Option<&str> {
        match &self.tenant {
            TenantSource::Header { name } => Some(name),
            _ => None,
        }
    }

    /// A hash of the header bytes this message's identity is read from,
    /// when headers alone decide it (None when the tenant or the key comes
    /// from the body). Two messages of one identity have the same hint, so
    /// a transport can keep one key's messages in order without parsing
    /// bodies; messages with different hints never share an identity.
    pub fn identity_hint(&self, msg: &Incoming) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        crate::identity::unquote(msg.header(&self.key_header)?).hash(&mut hasher);
        match &self.tenant {
            TenantSource::Header { name } => msg.header(name).hash(&mut hasher),
            TenantSource::Fixed { .. } => {}
            TenantSource::Body { .. } => return None,
        }
        Some(hasher.finish())
    }

    /// Reads a delivery's identity, fingerprint and derived key, or says why
    /// it is invalid: header names are UTF-8, the key and tenant headers
    /// appear once, the body fits `identity.max_body_bytes` and is a JSON
    /// object without repeated members, tenant and key are valid.
    pub fn parse(&self, msg: &Incoming) -> Result<Parsed, InvalidReason> {
        self.check_headers(msg)?;
        if msg.body.len() > self.max_body_bytes {
            return Err(InvalidReason::TooLarge {
                len: msg.body.len(),
                max: self.max_body_bytes,
            });
        }
        let body = json::parse(&msg.body).map_err(|e| match e {
            JsonError::DuplicateKey { .. } => InvalidReason::DuplicateMember(e),
            e => InvalidReason::NotJson(e),
        })?;
        if !body.is_object() {
            return Err(InvalidReason::NotObject);
        }
        let tenant = match &self.tenant {
            TenantSource::Header { name } => Tenant::parse(msg.header(name).unwrap_or_default()),
            TenantSource::Fixed { tenant } => Tenant::parse(tenant.as_bytes()),
            TenantSource::Body { pointer } => Tenant::parse(text_at(&body, pointer)),
        }
        .map_err(InvalidReason::Tenant)?;
        let key = match (msg.header(&self.key_header), &self.key_pointer) {
            // The same rule as the HTTP API's: `"order-1"` is `order-1`.
            (Some(raw), _) => IdempotencyKey::from_header(raw),
            (None, Some(pointer)) => IdempotencyKey::parse(text_at(&body, pointer)),
            (None, None) => IdempotencyKey::parse(&[]),
        }
        .map_err(InvalidReason::Key)?;
        let identity = Identity { tenant, key };
        let route = match &msg.source {
            Source::Http { route, .. } => Some(route.clone()),
            _ => msg
                .header(ROUTE_HEADER)
                .and_then(|r| std::str::from_utf8(r).ok())
                .map(str::to_string),
        };
        Ok(Parsed {
            fingerprint: self.fingerprint.fingerprint_lazily(&body, &msg.body),
            derived_key: self.derived_key.derive(&identity),
            identity,
            route,
        })
    }

    /// Header names must be text, and the headers that name the payment
    /// must appear once: a gateway that appends the authenticated tenant
    /// could otherwise be overruled by a header the sender set first.
    fn check_headers(&self, msg: &Incoming) -> Result<(), InvalidReason> {
        if let Some(bad) = msg.headers.iter().find(|h| h.name_str().is_none()) {
            return Err(InvalidReason::BadHeader {
                name: String::from_utf8_lossy(&bad.name).into_owned(),
            });
        }
        let identity_headers = [Some(self.key_header.as_str()), self.tenant_header()];
        for name in identity_headers.into_iter().flatten() {
            let count = msg.count_headers(name);
            if count > 1 {
                return Err(InvalidReason::DuplicateHeader {
                    name: name.to_string(),
                    count,
                });
            }
        }
        Ok(())
    }
}

fn text_at<'a>(body: &'a Json, pointer: &str) -> &'a [u8] {
    body.pointer(pointer)
        .and_then(Json::as_str)
        .map(str::as_bytes)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IdentitySettings;

    fn msg(tenant: &str, key: &str, body: &str) -> Incoming {
        Incoming::new(Source::Direct { id: 1 }, body)
            .with_header("client-id", tenant)
            .with_header("idempotency-key", key)
    }

    #[test]
    fn one_identity_has_one_hint_and_another_tenant_or_key_another() {
        let parser = Parser::new(&IdentitySettings::default());
        let hint = |m: &Incoming| parser.identity_hint(m).expect("headers decide");
        let a = hint(&msg("acme", "k1", r#"{"amount": 1}"#));
        assert_eq!(a, hint(&msg("acme", "k1", r#"{"amount": 2}"#)));
        assert_ne!(a, hint(&msg("acme", "k2", r#"{"amount": 1}"#)));
        assert_ne!(a, hint(&msg("umbrella", "k1", r#"{"amount": 1}"#)));
    }

    #[test]
    fn a_message_whose_identity_needs_its_body_has_no_hint() {
        let parser = Parser::new(&IdentitySettings {
            tenant: TenantSource::Body {
                pointer: "/client".into(),
            },
            ..IdentitySettings::default()
        });
        assert_eq!(parser.identity_hint(&msg("acme", "k1", "{}")), None);
        let parser = Parser::new(&IdentitySettings::default());
        let keyless =
            Incoming::new(Source::Direct { id: 1 }, "{}").with_header("client-id", "acme");
        assert_eq!(parser.identity_hint(&keyless), None);
    }
}
