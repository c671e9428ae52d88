//! The simulator's canonical JSON (keys sorted, no whitespace) and hex, as
//! a provider of its own computes them: it compares a repeated key's body
//! with the first, without knowing how dedupq fingerprints.

use serde_json::Value;

/// Lowercase hex of any bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// Writes `value` with object keys sorted by their bytes and no whitespace.
pub(crate) fn write_canonical(value: &Value, out: &mut String) {
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

    #[test]
    fn reordered_keys_and_whitespace_give_the_same_text() {
        let mut a = String::new();
        let mut b = String::new();
        write_canonical(
            &serde_json::from_str(r#"{"b": [1, {"d": 2, "c": 3}], "a": "x"}"#).unwrap(),
            &mut a,
        );
        write_canonical(
            &serde_json::from_str(r#"{"a":"x","b":[1,{"c":3,"d":2}]}"#).unwrap(),
            &mut b,
        );
        assert_eq!(a, r#"{"a":"x","b":[1,{"c":3,"d":2}]}"#);
        assert_eq!(a, b);
    }

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
    }
}
