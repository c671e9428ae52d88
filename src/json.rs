//! Strict JSON (RFC 8259) for message bodies.
//!
//! serde_json accepts an object with a repeated key (the last one wins,
//! while other parsers take the first: `{"amount":1,"amount":100000}` means
//! two different payments to two different readers) and reads every number
//! through `f64` or a 64-bit integer. This parser refuses repeated keys,
//! keeps every number exactly as written, and writes the canonical form the
//! fingerprint is computed over.
//!
//! Canonical form (fingerprint version 2 and later): object members sorted
//! by the UTF-8 bytes of their unescaped names, no insignificant whitespace,
//! strings escaped as serde_json escapes them (`"`, `\`, control characters
//! only), and numbers by exact decimal value: `-`, the significant digits
//! without leading or trailing zeros, then `e` and the power of ten unless
//! it is 0. So `10`, `10.0`, `1e1` and `1.00E+1` are all `1e1`, `0.50` is
//! `5e-1`, `-0` is `0`, and `10.000000000000001` stays distinct from `10`.

use std::fmt;

/// Nesting deeper than this is refused (serde_json's own limit).
const MAX_DEPTH: usize = 128;
/// Exponents beyond this magnitude are refused rather than guessed at.
const MAX_EXPONENT: i64 = 1_000_000_000;

/// A JSON value as the strict parser read it: numbers kept as written,
/// object members in input order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// The number's text exactly as it appeared in the input.
    Number(String),
    /// A string, unescaped.
    String(String),
    /// An array, in input order.
    Array(Vec<Json>),
    /// Members in input order; names are unique.
    Object(Vec<(String, Json)>),
}

/// Why a body is not strict JSON. A message body refused for it is
/// dead-lettered before any claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The bytes are not UTF-8; the offset of the first one that is not.
    #[error("not UTF-8 at byte {0}")]
    NotUtf8(usize),
    /// Not JSON (RFC 8259).
    #[error("{what} at byte {offset}")]
    Syntax {
        /// Byte offset of the fault.
        offset: usize,
        /// What is wrong there.
        what: &'static str,
    },
    /// An object names a member twice: readers disagree about which one
    /// counts, so the body cannot be shown to be one operation.
    #[error("the object at '{pointer}' has the member '{name}' twice")]
    DuplicateKey {
        /// JSON pointer to the object (empty for the top level).
        pointer: String,
        /// The repeated name.
        name: String,
    },
    /// Nested deeper than 128 levels.
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Parses one JSON text (surrounding whitespace allowed, nothing else).
pub fn parse(bytes: &[u8]) -> Result<Json, JsonError> {
    let text = std::str::from_utf8(bytes).map_err(|e| JsonError::NotUtf8(e.valid_up_to()))?;
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        at: 0,
        path: Vec::new(),
    };
    p.skip_ws();
    let value = p.value()?;
    p.skip_ws();
    if p.at != p.s.len() {
        return Err(p.error("trailing characters after the JSON value"));
    }
    Ok(value)
}

impl Json {
    /// RFC 6901 pointer lookup.
    pub fn pointer(&self, pointer: &str) -> Option<&Json> {
        if pointer.is_empty() {
            return Some(self);
        }
        let mut here = self;
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = unescape_token(token);
            here = match here {
                Json::Object(members) => &members.iter().find(|(n, _)| *n == token)?.1,
                Json::Array(items) => items.get(parse_index(&token)?)?,
                _ => return None,
            };
        }
        Some(here)
    }

    /// The text of a string value; None for any other value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// Whether it is an object, as a message body must be.
    pub fn is_object(&self) -> bool {
        matches!(self, Json::Object(_))
    }

    /// The canonical form (see the module documentation), leaving out the
    /// members at the `skip` pointers.
    pub fn write_canonical(&self, skip: &[Vec<String>], out: &mut Vec<u8>) {
        let mut path = Vec::new();
        self.write_at(&mut path, skip, out);
    }

    fn write_at(&self, path: &mut Vec<String>, skip: &[Vec<String>], out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Json::Number(text) => out.extend_from_slice(canonical_number(text).as_bytes()),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push(b'[');
                let mut first = true;
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    if !is_skipped(path, skip) {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        item.write_at(path, skip, out);
                    }
                    path.pop();
                }
                out.push(b']');
            }
            Json::Object(members) => {
                let mut sorted: Vec<&(String, Json)> = members.iter().collect();
                sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push(b'{');
                let mut first = true;
                for (name, value) in sorted {
                    path.push(name.clone());
                    if !is_skipped(path, skip) {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        write_string(name, out);
                        out.push(b':');
                        value.write_at(path, skip, out);
                    }
                    path.pop();
                }
                out.push(b'}');
            }
        }
    }
}

/// Splits a JSON pointer into its unescaped tokens (`/a~1b/0` → `a/b`, `0`).
pub fn pointer_tokens(pointer: &str) -> Vec<String> {
    pointer
        .strip_prefix('/')
        .map(|p| p.split('/').map(unescape_token).collect())
        .unwrap_or_default()
}

fn is_skipped(path: &[String], skip: &[Vec<String>]) -> bool {
    skip.iter().any(|s| s.as_slice() == path)
}

fn unescape_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn parse_index(token: &str) -> Option<usize> {
    if token.len() > 1 && token.starts_with('0') {
        return None;
    }
    token.parse().ok()
}

/// The exact decimal value of a JSON number in canonical form.
pub fn canonical_number(text: &str) -> String {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = int.chars().chain(frac.chars()).collect();
    let mut exponent = exponent - frac.len() as i64;
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return "0".into();
    }
    exponent += (digits.len() - significant.len()) as i64;
    let mut out = String::with_capacity(significant.len() + 8);
    if negative {
        out.push('-');
    }
    out.push_str(significant);
    if exponent != 0 {
        out.push('e');
        out.push_str(&exponent.to_string());
    }
    out
}

/// Writes a string the way serde_json does.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x00..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    at: usize,
    /// Names and indexes down to the value being parsed, for errors.
    path: Vec<String>,
}

impl Parser<'_> {
    fn error(&self, what: &'static str) -> JsonError {
        JsonError::Syntax {
            offset: self.at,
            what,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &'static [u8], value: Json) -> Result<Json, JsonError> {
        if self.s[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.error("invalid literal"))
        }
    }

    fn value(&mut self) -> Result<Json, JsonError> {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b't') => self.literal(b"true", Json::Bool(true)),
            Some(b'f') => self.literal(b"false", Json::Bool(false)),
            Some(b'n') => self.literal(b"null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("unexpected character")),
            None => Err(self.error("unexpected end of input")),
        }
    }

    fn enter(&self) -> Result<(), JsonError> {
        if self.path.len() >= MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        Ok(())
    }

    fn object(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.at += 1;
        let mut members: Vec<(String, Json)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a member name"));
            }
            let name = self.string()?;
            if members.iter().any(|(n, _)| *n == name) {
                return Err(JsonError::DuplicateKey {
                    pointer: self.pointer(),
                    name,
                });
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.error("expected ':'"));
            }
            self.at += 1;
            self.skip_ws();
            self.path.push(name.clone());
            let value = self.value()?;
            self.path.pop();
            members.push((name, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.at += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            self.path.push(items.len().to_string());
            let item = self.value()?;
            self.path.pop();
            items.push(item);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    fn pointer(&self) -> String {
        self.path
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect()
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Json, JsonError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.error("invalid number: no digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            let exp_start = self.at;
            if self.digits() == 0 {
                return Err(self.error("invalid number: no digit in the exponent"));
            }
            let magnitude = self.text[exp_start..self.at].trim_start_matches('0');
            if magnitude.len() > 10 || magnitude.parse::<i64>().unwrap_or(0) > MAX_EXPONENT {
                return Err(self.error("number exponent out of range"));
            }
        }
        Ok(Json::Number(self.text[start..self.at].to_string()))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let hex = self
            .text
            .get(self.at..self.at + 4)
            .ok_or_else(|| self.error("truncated \\u escape"))?;
        let v = u32::from_str_radix(hex, 16).map_err(|_| self.error("invalid \\u escape"))?;
        self.at += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let run_start = self.at;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            out.push_str(&self.text[run_start..self.at]);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.at += 1;
                            out.push(self.unicode_escape()?);
                            continue;
                        }
                        _ => return Err(self.error("invalid escape")),
                    };
                    self.at += 1;
                    out.push(c);
                }
                Some(_) => return Err(self.error("control character in a string")),
                None => return Err(self.error("unterminated string")),
            }
        }
    }

    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.s[self.at..].starts_with(b"\\u") {
                    return Err(self.error("lone leading surrogate in \\u escape"));
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("invalid trailing surrogate in \\u escape"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error("lone trailing surrogate in \\u escape")),
            c => c,
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Vec::new();
        self.write_canonical(&[], &mut out);
        f.write_str(&String::from_utf8_lossy(&out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        let mut out = Vec::new();
        parse(text.as_bytes())
            .unwrap()
            .write_canonical(&[], &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_compare_by_exact_decimal_value() {
        for same in [
            "10", "10.0", "10.00", "1e1", "1E+1", "1.0e1", "100e-1", "0.01e3",
        ] {
            assert_eq!(canonical_number(same), "1e1", "{same}");
        }
        assert_eq!(canonical_number("-0"), "0");
        assert_eq!(canonical_number("-0.000e5"), "0");
        assert_eq!(canonical_number("0.5"), "5e-1");
        assert_eq!(canonical_number("123"), "123");
        assert_eq!(canonical_number("-12.30"), "-123e-1");
        assert_eq!(
            canonical_number("10.000000000000001"),
            "10000000000000001e-15"
        );
        assert_ne!(
            canonical_number("18446744073709551617"),
            canonical_number("18446744073709551616")
        );
        assert_ne!(
            canonical_number("9007199254740993"),
            canonical_number("9007199254740992")
        );
    }

    #[test]
    fn a_repeated_member_name_is_refused_with_its_place() {
        let e = parse(br#"{"amount":1,"amount":100000}"#).unwrap_err();
        assert_eq!(
            e,
            JsonError::DuplicateKey {
                pointer: String::new(),
                name: "amount".into()
            }
        );
        let e = parse(br#"{"a":{"b":[{"x":1,"x":2}]}}"#).unwrap_err();
        assert!(matches!(e, JsonError::DuplicateKey { ref pointer, .. } if pointer == "/a/b/0"));
        // Equal after unescaping is the same name.
        assert!(parse(br#"{"a":1,"\u0061":2}"#).is_err());
    }

    #[test]
    fn canonical_form_sorts_members_and_keeps_strings_as_serde_json_writes_them() {
        assert_eq!(
            canonical(
                " { \"b\" : [1, {\"d\": null, \"c\": \"\\u00e9\\n\\u0000\"}], \"a\": true } "
            ),
            "{\"a\":true,\"b\":[1,{\"c\":\"é\\n\\u0000\",\"d\":null}]}"
        );
    }

    #[test]
    fn invalid_texts_are_refused() {
        for bad in [
            &b""[..],
            b"{",
            b"{\"a\":1,}",
            b"[1,]",
            b"01",
            b"1.",
            b"1e",
            b"-",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"a\x01\"",
            b"{} {}",
            b"\xff",
            b"nul",
            b"1e9999999999999",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(parse(deep.as_bytes()), Err(JsonError::TooDeep));
    }

    #[test]
    fn pointers_find_members_and_items_and_skip_leaves_them_out() {
        let v = parse(br#"{"a/b":{"~x":[10,20]},"sent_at":"t","n":1}"#).unwrap();
        assert_eq!(v.pointer("/a~1b/~0x/1"), Some(&Json::Number("20".into())));
        assert_eq!(v.pointer("/missing"), None);
        let mut out = Vec::new();
        v.write_canonical(
            &[pointer_tokens("/sent_at"), pointer_tokens("/a~1b/~0x/0")],
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a/b":{"~x":[2e1]},"n":1}"#
        );
    }

    #[test]
    fn surrogate_pairs_decode_to_one_character() {
        assert_eq!(
            parse(br#""\ud83d\ude00""#).unwrap(),
            Json::String("\u{1F600}".into())
        );
    }
}
