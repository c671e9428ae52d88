//! Where a route finds the idempotency key: a header (`Idempotency-Key`,
//! or a webhook sender's event-id header), else a JSON pointer into the
//! body (a webhook's event id).

use super::problem::Problem;
use crate::identity::{IdempotencyKey, IdentityError};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use serde_json::Value;

#[derive(Debug, Clone)]
pub(super) struct KeySource {
    pub header: Option<HeaderName>,
    pub pointer: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum KeyError {
    #[error("the idempotency key is required: {0}")]
    Missing(String),
    #[error("{0} is sent more than once")]
    Repeated(HeaderName),
    #[error("{0}")]
    Invalid(#[from] IdentityError),
    #[error("keys starting with {0:?} belong to the webhook routes")]
    Reserved(&'static str),
}

impl From<KeyError> for Problem {
    fn from(e: KeyError) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-key",
            "The idempotency key is missing or invalid; nothing was done",
            e.to_string(),
        )
    }
}

impl KeySource {
    pub(super) fn extract(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<IdempotencyKey, KeyError> {
        if let Some(name) = &self.header {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => return Ok(IdempotencyKey::from_header(v.as_bytes())?),
                (Some(_), Some(_)) => return Err(KeyError::Repeated(name.clone())),
                (None, _) => {}
            }
        }
        let Some(pointer) = &self.pointer else {
            return Err(KeyError::Missing(self.wanted()));
        };
        let body: Value = serde_json::from_slice(body).map_err(|_| {
            KeyError::Missing(format!("{}, and the body is not JSON", self.wanted()))
        })?;
        let key = match body.pointer(pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
            _ => return Err(KeyError::Missing(self.wanted())),
        };
        Ok(IdempotencyKey::parse(key.as_bytes())?)
    }

    fn wanted(&self) -> String {
        match (&self.header, &self.pointer) {
            (Some(h), Some(p)) => format!("send the {h} header or {p} in the body"),
            (Some(h), None) => format!("send the {h} header"),
            (None, Some(p)) => format!("send {p} in the body"),
            (None, None) => "this route has no key source".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn source(header: Option<&'static str>, pointer: Option<&str>) -> KeySource {
        KeySource {
            header: header.map(HeaderName::from_static),
            pointer: pointer.map(str::to_string),
        }
    }

    fn with(name: &'static str, values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(name, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_quoted_and_a_bare_key_are_the_same_key() {
        let s = source(Some("idempotency-key"), None);
        let bare = s
            .extract(&with("idempotency-key", &["pay-1"]), b"{}")
            .unwrap();
        let quoted = s
            .extract(&with("idempotency-key", &["\"pay-1\""]), b"{}")
            .unwrap();
        assert_eq!(bare, quoted);
        let escaped = s
            .extract(&with("idempotency-key", &[r#""a\"b""#]), b"{}")
            .unwrap();
        assert_eq!(escaped.as_str(), "a\"b");
    }

    #[test]
    fn a_missing_repeated_or_invalid_key_is_refused() {
        let s = source(Some("idempotency-key"), None);
        assert!(matches!(
            s.extract(&HeaderMap::new(), b"{}"),
            Err(KeyError::Missing(_))
        ));
        assert!(matches!(
            s.extract(&with("idempotency-key", &["a", "b"]), b"{}"),
            Err(KeyError::Repeated(_))
        ));
        assert!(matches!(
            s.extract(&with("idempotency-key", &["\"a b\""]), b"{}"),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn a_webhook_event_id_is_read_from_the_body_when_no_header_names_it() {
        let s = source(None, Some("/id"));
        let key = s.extract(&HeaderMap::new(), br#"{"id":"evt_1"}"#).unwrap();
        assert_eq!(key.as_str(), "evt_1");
        let key = s.extract(&HeaderMap::new(), br#"{"id":42}"#).unwrap();
        assert_eq!(key.as_str(), "42");
        assert!(s.extract(&HeaderMap::new(), b"not json").is_err());
        assert!(s.extract(&HeaderMap::new(), br#"{"id":null}"#).is_err());
    }
}
