//! What makes two messages with the same key "the same operation": a SHA-256
//! over the canonical JSON of the fields that define it.
//!
//! Version 2 and later (the default): the canonical form of [`crate::json`]
//! — members sorted by name, no whitespace, numbers by exact decimal value
//! (`10`, `10.0` and `1e1` are one amount; `10.000000000000001` is another;
//! no number goes through a float). Version 1, the form of earlier releases:
//! numbers as serde_json wrote them after reading them through `f64`
//! (`10` and `10.0` differed, large amounts could collide). Rows stored
//! under version 1 are still compared under version 1: every message also
//! carries its version-1 digest while the configured version is newer.

use crate::json::{pointer_tokens, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The canonical form of earlier releases.
pub const LEGACY_VERSION: i16 = 1;

/// Which fields of the body take part in the fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FingerprintSpec {
    /// Bumped whenever `include`/`exclude` change, so rows stored under the
    /// old definition are not reported as conflicts. 1 selects the legacy
    /// canonical form; 2 and later the exact one.
    pub version: i16,
    /// JSON pointers that define the operation (e.g. `/amount`). Empty: the
    /// whole body, minus `exclude`.
    #[serde(default)]
    pub include: Vec<String>,
    /// JSON pointers to leave out (e.g. `/sent_at`, `/attempt`).
    #[serde(default)]
    pub exclude: Vec<String>,
}

impl Default for FingerprintSpec {
    fn default() -> Self {
        Self {
            version: 2,
            include: Vec::new(),
            exclude: vec!["/sent_at".into(), "/attempt".into()],
        }
    }
}

/// One message as an operation: the digest of the fields that define it.
/// The same key with another fingerprint is a conflict, never run.
#[derive(Clone)]
pub struct Fingerprint {
    /// The [`FingerprintSpec::version`] it was computed under; stored with
    /// the key so that a row is compared under its own field set.
    pub version: i16,
    /// SHA-256 over the canonical JSON of the defining fields.
    pub digest: [u8; 32],
    /// The version-1 digest of the same message, to compare with rows
    /// stored under version 1 (None when `version` is 1 itself, or when the
    /// body cannot be read the legacy way, e.g. a number beyond `f64`).
    legacy: Arc<Legacy>,
}

/// The version-1 digest, worked out the first time a version-1 row asks
/// for it: it reads the body a second time (as serde_json values), which
/// cost more than the rest of a message's parsing, and most key tables
/// hold no version-1 row.
struct Legacy {
    digest: OnceLock<Option<[u8; 32]>>,
    /// What it is worked out from; None once known from the start.
    from: Option<(Arc<FingerprintSpec>, Box<[u8]>)>,
}

impl Legacy {
    fn known(digest: Option<[u8; 32]>) -> Arc<Self> {
        Arc::new(Self {
            digest: OnceLock::from(digest),
            from: None,
        })
    }

    fn get(&self) -> Option<&[u8; 32]> {
        self.digest
            .get_or_init(|| {
                let (spec, raw) = self.from.as_ref()?;
                spec.legacy_of(raw)
            })
            .as_ref()
    }
}

/// Two fingerprints are equal when version and digest are (the legacy
/// digest follows from the same body).
impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        (self.version, self.digest) == (other.version, other.digest)
    }
}

impl Eq for Fingerprint {}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.version, self.digest).hash(state)
    }
}

impl Fingerprint {
    /// The digest in lowercase hex.
    pub fn hex(&self) -> String {
        hex(&self.digest)
    }

    /// The version-1 digest if it was already worked out (never works it
    /// out): what a claim sends, so that only messages that met a
    /// version-1 row pay for it.
    pub fn legacy_if_known(&self) -> Option<&[u8; 32]> {
        if self.version == LEGACY_VERSION {
            return Some(&self.digest);
        }
        self.legacy.digest.get().and_then(Option::as_ref)
    }

    /// The digest to compare with a row stored under `version`; None when
    /// that row cannot be compared (another field set: the key decides).
    pub fn digest_for(&self, version: i16) -> Option<&[u8; 32]> {
        if version == self.version {
            Some(&self.digest)
        } else if version == LEGACY_VERSION {
            self.legacy.get()
        } else {
            None
        }
    }
}

/// `v<version>:<hex digest>`: the one text form, in dead letters, replies
/// and logs on every transport.
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}:{}", self.version, self.hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Lowercase hex of any bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

impl FingerprintSpec {
    /// Checks the pointers once, at start-up.
    pub fn validate(&self) -> Result<(), String> {
        for p in self.include.iter().chain(&self.exclude) {
            if !p.starts_with('/') {
                return Err(format!(
                    "'{p}' is not a JSON pointer: it must start with '/'"
                ));
            }
        }
        if !self.include.is_empty() && !self.exclude.is_empty() {
            return Err("set either include or exclude, not both".into());
        }
        if self.version < 1 {
            return Err(format!("version {} must be at least 1", self.version));
        }
        Ok(())
    }

    /// The fingerprint of a body already read by [`crate::json::parse`];
    /// `raw` is the same body as received (for the legacy digest, worked
    /// out here).
    pub fn fingerprint(&self, body: &Json, raw: &[u8]) -> Fingerprint {
        if self.version == LEGACY_VERSION {
            return Fingerprint {
                version: self.version,
                digest: self
                    .legacy_of(raw)
                    .unwrap_or_else(|| self.exact_digest(body)),
                legacy: Legacy::known(None),
            };
        }
        Fingerprint {
            version: self.version,
            digest: self.exact_digest(body),
            legacy: Legacy::known(self.legacy_of(raw)),
        }
    }

    /// The same, with the legacy digest worked out only if a version-1 row
    /// asks for it.
    pub fn fingerprint_lazily(self: &Arc<Self>, body: &Json, raw: &[u8]) -> Fingerprint {
        if self.version == LEGACY_VERSION {
            return self.fingerprint(body, raw);
        }
        Fingerprint {
            version: self.version,
            digest: self.exact_digest(body),
            legacy: Arc::new(Legacy {
                digest: OnceLock::new(),
                from: Some((self.clone(), raw.into())),
            }),
        }
    }

    fn legacy_of(&self, raw: &[u8]) -> Option<[u8; 32]> {
        serde_json::from_slice::<Value>(raw)
            .ok()
            .map(|v| self.legacy_digest(&v))
    }

    fn exact_digest(&self, body: &Json) -> [u8; 32] {
        let mut canonical = Vec::with_capacity(256);
        if self.include.is_empty() {
            let skip: Vec<Vec<String>> = self.exclude.iter().map(|p| pointer_tokens(p)).collect();
            body.write_canonical(&skip, &mut canonical);
        } else {
            // Missing fields count as null, so an absent and an explicit
            // null field mean the same operation.
            let picked = Json::Object(
                self.include
                    .iter()
                    .map(|p| (p.clone(), body.pointer(p).cloned().unwrap_or(Json::Null)))
                    .collect(),
            );
            picked.write_canonical(&[], &mut canonical);
        }
        Sha256::digest(&canonical).into()
    }

    fn legacy_digest(&self, body: &Value) -> [u8; 32] {
        let mut canonical = String::new();
        if self.include.is_empty() {
            let mut body = body.clone();
            for pointer in &self.exclude {
                remove_pointer(&mut body, pointer);
            }
            write_canonical(&body, &mut canonical);
        } else {
            let picked: serde_json::Map<String, Value> = self
                .include
                .iter()
                .map(|p| (p.clone(), body.pointer(p).cloned().unwrap_or(Value::Null)))
                .collect();
            write_canonical(&Value::Object(picked), &mut canonical);
        }
        Sha256::digest(canonical.as_bytes()).into()
    }
}

fn remove_pointer(body: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let parent = if parent.is_empty() {
        Some(body)
    } else {
        body.pointer_mut(parent)
    };
    match parent {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Writes `value` in the legacy (version 1) canonical form.
pub fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(spec: &FingerprintSpec, text: &str) -> Fingerprint {
        let body = crate::json::parse(text.as_bytes()).unwrap();
        spec.fingerprint(&body, text.as_bytes())
    }

    #[test]
    fn reordered_keys_and_whitespace_give_the_same_fingerprint() {
        let spec = FingerprintSpec::default();
        let a = fp(&spec, r#"{"amount":10,"meta":{"b":1,"a":2}}"#);
        let b = fp(&spec, "{ \"meta\" : {\"a\":2, \"b\":1},\n \"amount\": 10 }");
        assert_eq!(a, b);
    }

    #[test]
    fn excluded_fields_do_not_change_the_fingerprint_but_others_do() {
        let spec = FingerprintSpec::default();
        let a = fp(
            &spec,
            r#"{"amount": 10, "sent_at": "2026-01-01T00:00:00Z"}"#,
        );
        let b = fp(
            &spec,
            r#"{"amount": 10, "sent_at": "2026-01-02T00:00:00Z"}"#,
        );
        let c = fp(
            &spec,
            r#"{"amount": 11, "sent_at": "2026-01-01T00:00:00Z"}"#,
        );
        assert_eq!(a, b);
        assert_ne!(a.digest, c.digest);
    }

    #[test]
    fn included_fields_alone_define_the_operation() {
        let spec = FingerprintSpec {
            version: 3,
            include: vec!["/amount".into(), "/currency".into()],
            exclude: vec![],
        };
        let a = fp(&spec, r#"{"amount": 10, "currency": "EUR", "note": "x"}"#);
        let b = fp(&spec, r#"{"amount": 10.0, "currency": "EUR", "note": "y"}"#);
        let c = fp(&spec, r#"{"amount": 10, "currency": "USD", "note": "x"}"#);
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, c.digest);
        assert_eq!(a.version, 3);
    }

    #[test]
    fn version_two_compares_amounts_by_exact_value_where_version_one_did_not() {
        let v2 = FingerprintSpec::default();
        let v1 = FingerprintSpec {
            version: 1,
            ..FingerprintSpec::default()
        };
        // A JS producer and a Jackson one writing the same amount.
        assert_eq!(
            fp(&v2, r#"{"amount":10}"#).digest,
            fp(&v2, r#"{"amount":10.0}"#).digest
        );
        assert_ne!(
            fp(&v1, r#"{"amount":10}"#).digest,
            fp(&v1, r#"{"amount":10.0}"#).digest
        );
        // Two different large amounts that collide through f64.
        let (a, b) = (
            r#"{"amount":9007199254740993.5}"#,
            r#"{"amount":9007199254740993.25}"#,
        );
        assert_ne!(fp(&v2, a).digest, fp(&v2, b).digest);
        assert_eq!(fp(&v1, a).digest, fp(&v1, b).digest);
    }

    #[test]
    fn a_version_two_fingerprint_carries_the_version_one_digest_for_old_rows() {
        let v2 = FingerprintSpec::default();
        let v1 = FingerprintSpec {
            version: 1,
            ..FingerprintSpec::default()
        };
        let text = r#"{"amount":10.5,"sent_at":"x"}"#;
        let new = fp(&v2, text);
        let old = fp(&v1, text);
        assert_eq!(new.digest_for(1), Some(&old.digest));
        assert_eq!(new.digest_for(2), Some(&new.digest));
        assert_eq!(new.digest_for(7), None);
        assert_eq!(old.digest_for(1), Some(&old.digest));
        assert_eq!(new.to_string(), format!("v2:{}", new.hex()));
    }

    #[test]
    fn a_lazy_fingerprint_finds_the_same_version_one_digest_when_asked() {
        let v2 = Arc::new(FingerprintSpec::default());
        let v1 = FingerprintSpec {
            version: 1,
            ..FingerprintSpec::default()
        };
        for text in [r#"{"amount":10.5,"sent_at":"x"}"#, r#"{"amount":1e400}"#] {
            let body = crate::json::parse(text.as_bytes()).unwrap();
            let lazy = v2.fingerprint_lazily(&body, text.as_bytes());
            assert_eq!(lazy, fp(&v2, text));
            assert_eq!(
                lazy.digest_for(1),
                fp(&v2, text).digest_for(1),
                "{text}: the same legacy digest, or none"
            );
            if text.contains("10.5") {
                assert_eq!(lazy.digest_for(1), Some(&fp(&v1, text).digest));
            }
        }
    }

    #[test]
    fn legacy_canonical_json_sorts_keys_and_drops_whitespace() {
        let mut out = String::new();
        write_canonical(
            &serde_json::json!({"b": [1, {"d": null, "c": "é"}], "a": true}),
            &mut out,
        );
        assert_eq!(out, r#"{"a":true,"b":[1,{"c":"é","d":null}]}"#);
    }
}
