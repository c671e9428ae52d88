//! The identity of a message: who sent it (tenant) and which operation it is
//! (idempotency key). Both are validated once, here, and carried as newtypes.

use std::fmt;

/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// Longest tenant accepted, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;

/// Why a tenant or key is refused. A message it concerns is dead-lettered
/// before any claim, and never retried; an HTTP request is refused (a bad
/// key with 400) before any claim too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The tenant is absent or empty where the configuration looks for it.
    #[error("no tenant: the message carries none where the configuration looks for it")]
    MissingTenant,
    /// The key is absent or empty where the configuration looks for it.
    #[error("no idempotency key: the message carries none where the configuration looks for it")]
    MissingKey,
    /// Longer than [`MAX_TENANT_BYTES`] or [`MAX_KEY_BYTES`].
    #[error("{what} is {len} bytes; the limit is {max}")]
    TooLong {
        /// `tenant` or `idempotency key`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A byte outside visible ASCII (0x21..=0x7e), or a `:` in a tenant.
    #[error("{what} must be visible ASCII (0x21..=0x7e){extra}")]
    NotVisibleAscii {
        /// `tenant` or `idempotency key`.
        what: &'static str,
        /// What else the rule forbids, for the message (a tenant's `:`).
        extra: &'static str,
    },
}

fn is_visible_ascii(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A client of the deployment. Scopes every key: the same key under two
/// tenants is two operations. It may not contain `:` so that the derived
/// provider key `tenant:key` is unambiguous.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

impl Tenant {
    /// Accepts 1..=128 bytes of visible ASCII without `:`.
    pub fn parse(raw: &[u8]) -> Result<Self, IdentityError> {
        if raw.is_empty() {
            return Err(IdentityError::MissingTenant);
        }
        if raw.len() > MAX_TENANT_BYTES {
            return Err(IdentityError::TooLong {
                what: "tenant",
                len: raw.len(),
                max: MAX_TENANT_BYTES,
            });
        }
        if !is_visible_ascii(raw) || raw.contains(&b':') {
            return Err(IdentityError::NotVisibleAscii {
                what: "tenant",
                extra: " and may not contain ':'",
            });
        }
        // Visible ASCII is valid UTF-8.
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The tenant as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sender's name for one operation: 1..=255 bytes of visible ASCII,
/// compared byte for byte (no case or collation folding).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Accepts 1..=255 bytes of visible ASCII, kept exactly as given.
    pub fn parse(raw: &[u8]) -> Result<Self, IdentityError> {
        if raw.is_empty() {
            return Err(IdentityError::MissingKey);
        }
        if raw.len() > MAX_KEY_BYTES {
            return Err(IdentityError::TooLong {
                what: "idempotency key",
                len: raw.len(),
                max: MAX_KEY_BYTES,
            });
        }
        if !is_visible_ascii(raw) {
            return Err(IdentityError::NotVisibleAscii {
                what: "idempotency key",
                extra: "",
            });
        }
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The key as a header carries it: a structured-field string
    /// (`"order-1"`, as draft-ietf-httpapi-idempotency-key-header defines
    /// it) and the bare key (`order-1`, as most clients send it) are the
    /// same key, on every transport, so a relay that copies the header
    /// from HTTP to a queue never makes one payment two.
    pub fn from_header(raw: &[u8]) -> Result<Self, IdentityError> {
        Self::parse(&unquote(raw))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A structured-field string's content (`"a\"b"` is `a"b`); anything that
/// is not one is kept as sent, so the key check refuses it rather than
/// guessing.
pub fn unquote(raw: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Some(inner) = raw.strip_prefix(b"\"").and_then(|r| r.strip_suffix(b"\"")) else {
        return raw.into();
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return raw.into(),
            },
            b'"' => return raw.into(),
            _ => out.push(b),
        }
    }
    out.into()
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fencing token of one claim. Every claim or takeover increments it;
/// every later write carries it and only lands if it still matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub i64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `(tenant, key)`: one operation, whatever transport it arrives on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// Who sent it.
    pub tenant: Tenant,
    /// Which of the tenant's operations it is.
    pub key: IdempotencyKey,
}

impl Identity {
    /// The key sent to the provider (version 1: `tenant:key`). The same on
    /// every attempt, so a provider that honours idempotency keys recognises
    /// a retry after a crash.
    pub fn derived_key(&self) -> String {
        format!("{}:{}", self.tenant, self.key)
    }
}

/// How the key sent to the provider is derived from `(tenant, key)`.
/// Stored with the key at its first claim, so a change of format never
/// changes the key of a payment already under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DerivedKeyFormat {
    /// `tenant:key`, up to 384 characters.
    Plain,
    /// The first `n` hex digits (32..=64) of SHA-256 over `tenant:key`: no
    /// `:`, and short enough for providers that limit key length (Stripe:
    /// 255).
    Sha256(usize),
}

impl DerivedKeyFormat {
    /// Reads `tenant:key` or `sha256:<n>` (the configuration's spelling).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "tenant:key" => Some(Self::Plain),
            _ => {
                let n: usize = text.strip_prefix("sha256:")?.parse().ok()?;
                (32..=64).contains(&n).then_some(Self::Sha256(n))
            }
        }
    }

    /// The provider key for `id` in this format.
    pub fn derive(self, id: &Identity) -> String {
        match self {
            Self::Plain => id.derived_key(),
            Self::Sha256(n) => {
                use sha2::{Digest, Sha256};
                let digest = Sha256::digest(id.derived_key().as_bytes());
                let mut hex = crate::fingerprint::hex(&digest);
                hex.truncate(n);
                hex
            }
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_255_bytes_is_accepted_and_256_is_refused() {
        assert!(IdempotencyKey::parse(&[b'a'; 255]).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&[b'a'; 256]),
            Err(IdentityError::TooLong {
                what: "idempotency key",
                len: 256,
                max: 255
            })
        );
    }

    #[test]
    fn keys_with_spaces_or_non_ascii_are_refused() {
        assert!(IdempotencyKey::parse(b"a b").is_err());
        assert!(IdempotencyKey::parse("ключ".as_bytes()).is_err());
        assert_eq!(IdempotencyKey::parse(b""), Err(IdentityError::MissingKey));
    }

    #[test]
    fn keys_differing_only_in_case_are_different_keys() {
        assert_ne!(
            IdempotencyKey::parse(b"Pay-1").unwrap(),
            IdempotencyKey::parse(b"pay-1").unwrap()
        );
    }

    #[test]
    fn a_tenant_with_a_colon_is_refused_so_derived_keys_stay_unambiguous() {
        assert!(Tenant::parse(b"a:b").is_err());
        let id = Identity {
            tenant: Tenant::parse(b"acme").unwrap(),
            key: IdempotencyKey::parse(b"k:1").unwrap(),
        };
        assert_eq!(id.derived_key(), "acme:k:1");
    }

    #[test]
    fn a_hashed_derived_key_has_the_asked_length_and_no_colon() {
        let id = Identity {
            tenant: Tenant::parse(&[b't'; 128]).unwrap(),
            key: IdempotencyKey::parse(&[b'k'; 255]).unwrap(),
        };
        assert_eq!(
            DerivedKeyFormat::parse("tenant:key"),
            Some(DerivedKeyFormat::Plain)
        );
        assert_eq!(DerivedKeyFormat::Plain.derive(&id).len(), 384);
        let f = DerivedKeyFormat::parse("sha256:40").unwrap();
        let k = f.derive(&id);
        assert_eq!(k.len(), 40);
        assert!(!k.contains(':'));
        assert_eq!(k, f.derive(&id.clone()));
        assert_eq!(DerivedKeyFormat::parse("sha256:16"), None);
        assert_eq!(DerivedKeyFormat::parse("md5:32"), None);
    }
}
