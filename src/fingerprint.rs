//! What makes two messages with the same key "the same operation": a SHA-256
//! over the canonical JSON of the fields that define it.
//!
//! Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant
//! whitespace, strings and numbers as serde_json writes them. Numbers are
//! compared as written (`10` and `10.0` differ): the producer's encoder is
//! expected to be stable, and guessing numeric equality is riskier.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

/// Which fields of the body take part in the fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FingerprintSpec {
    /// Bumped whenever `include`/`exclude` change, so rows stored under the
    /// old definition are not reported as conflicts.
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
            version: 1,
            include: Vec::new(),
            exclude: vec!["/sent_at".into(), "/attempt".into()],
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub version: i16,
    pub digest: [u8; 32],
}

impl Fingerprint {
    pub fn hex(&self) -> String {
        hex(&self.digest)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}:{}", self.version, self.hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

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
        Ok(())
    }

    pub fn fingerprint(&self, body: &Value) -> Fingerprint {
        let mut canonical = String::new();
        if self.include.is_empty() {
            let mut body = body.clone();
            for pointer in &self.exclude {
                remove_pointer(&mut body, pointer);
            }
            write_canonical(&body, &mut canonical);
        } else {
            // Missing fields count as null, so an absent and an explicit
            // null field mean the same operation.
            let picked: serde_json::Map<String, Value> = self
                .include
                .iter()
                .map(|p| (p.clone(), body.pointer(p).cloned().unwrap_or(Value::Null)))
                .collect();
            write_canonical(&Value::Object(picked), &mut canonical);
        }
        Fingerprint {
            version: self.version,
            digest: Sha256::digest(canonical.as_bytes()).into(),
        }
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

/// Writes `value` as canonical JSON.
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
    use serde_json::json;

    #[test]
    fn reordered_keys_and_whitespace_give_the_same_fingerprint() {
        let spec = FingerprintSpec::default();
        let a: Value = serde_json::from_str(r#"{"amount":10,"meta":{"b":1,"a":2}}"#).unwrap();
        let b: Value =
            serde_json::from_str("{ \"meta\" : {\"a\":2, \"b\":1},\n \"amount\": 10 }").unwrap();
        assert_eq!(spec.fingerprint(&a), spec.fingerprint(&b));
    }

    #[test]
    fn excluded_fields_do_not_change_the_fingerprint_but_others_do() {
        let spec = FingerprintSpec::default();
        let a = json!({"amount": 10, "sent_at": "2026-01-01T00:00:00Z"});
        let b = json!({"amount": 10, "sent_at": "2026-01-02T00:00:00Z"});
        let c = json!({"amount": 11, "sent_at": "2026-01-01T00:00:00Z"});
        assert_eq!(spec.fingerprint(&a), spec.fingerprint(&b));
        assert_ne!(spec.fingerprint(&a), spec.fingerprint(&c));
    }

    #[test]
    fn included_fields_alone_define_the_operation() {
        let spec = FingerprintSpec {
            version: 2,
            include: vec!["/amount".into(), "/currency".into()],
            exclude: vec![],
        };
        let a = json!({"amount": 10, "currency": "EUR", "note": "x"});
        let b = json!({"amount": 10, "currency": "EUR", "note": "y"});
        let c = json!({"amount": 10, "currency": "USD", "note": "x"});
        assert_eq!(spec.fingerprint(&a), spec.fingerprint(&b));
        assert_ne!(spec.fingerprint(&a), spec.fingerprint(&c));
        assert_eq!(spec.fingerprint(&a).version, 2);
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let mut out = String::new();
        write_canonical(
            &json!({"b": [1, {"d": null, "c": "é"}], "a": true}),
            &mut out,
        );
        assert_eq!(out, r#"{"a":true,"b":[1,{"c":"é","d":null}]}"#);
    }
}
