//! Webhook senders authenticate by signing the raw body with a shared
//! secret. The signature is checked before anything is claimed; MACs are
//! compared in constant time.

use super::problem::Problem;
use super::reload::FileBacked;
use crate::config::{ConfigError, RouteSettings, WebhookKind};
use crate::identity::Tenant;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// A webhook route's sender: its secrets, signature format and tenant.
pub(super) struct Webhook {
    kind: WebhookKind,
    header: HeaderName,
    /// Several while a secret is being rotated: any one may sign. Read
    /// again when the file changes.
    secrets: FileBacked<Vec<Vec<u8>>>,
    tolerance: Duration,
    tenant: Tenant,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum SignatureError {
    #[error("no {0} header")]
    Missing(HeaderName),
    #[error("the {0} header is not in the sender's format")]
    Malformed(HeaderName),
    #[error("the signature does not match the body")]
    Mismatch,
    #[error("the signed timestamp is {age_secs} s away from now; at most {tolerance_secs} s is accepted")]
    Expired { age_secs: i64, tolerance_secs: u64 },
}

impl From<SignatureError> for Problem {
    fn from(e: SignatureError) -> Self {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "bad-signature",
            "The webhook signature is not valid; nothing was done",
            e.to_string(),
        )
    }
}

impl Webhook {
    /// Whether the sender signs its event id (Stripe's is in the signed
    /// body, with a signed timestamp). GitHub's, Shopify's and a generic
    /// HMAC sender's event id header is not signed and carries no time: a
    /// captured delivery replayed with a new id would be a new key.
    pub(super) fn signs_its_event_id(&self) -> bool {
        self.kind == WebhookKind::Stripe
    }

    /// Reads the route's secret file; `i` names the route in errors.
    pub(super) fn load(
        i: usize,
        kind: WebhookKind,
        r: &RouteSettings,
    ) -> Result<Self, ConfigError> {
        let setting = |field: &str| format!("api.routes[{i}].{field}");
        let path = r.secret_file.as_deref().ok_or_else(|| {
            ConfigError::new(
                &setting("secret_file"),
                "is not set",
                "point it at the secret",
            )
        })?;
        let secrets = FileBacked::load(&setting("secret_file"), path, {
            let setting = setting("secret_file");
            move |path, text| parse_secrets(&setting, path, text)
        })?;
        let tenant = r.tenant.as_deref().unwrap_or_default();
        let tenant = Tenant::parse(tenant.as_bytes()).map_err(|e| {
            ConfigError::new(
                &setting("tenant"),
                e.to_string(),
                "name the secret's tenant",
            )
        })?;
        let header = match kind {
            WebhookKind::Stripe => HeaderName::from_static("stripe-signature"),
            WebhookKind::Github => HeaderName::from_static("x-hub-signature-256"),
            WebhookKind::Shopify => HeaderName::from_static("x-shopify-hmac-sha256"),
            WebhookKind::Hmac => r
                .signature_header
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .ok_or_else(|| {
                    ConfigError::new(&setting("signature_header"), "is not set", "name it")
                })?,
        };
        Ok(Self {
            kind,
            header,
            secrets,
            tolerance: r.tolerance,
            tenant,
        })
    }

    /// Reads the secret file again if it changed (see `reload`).
    pub(super) fn reload_logged(&self) {
        self.secrets.reload_logged();
    }

    /// Checks the signature of `body`; on success the sender's tenant.
    pub(super) fn authenticate(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Tenant, SignatureError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.verify_at(headers, body, now)?;
        Ok(self.tenant.clone())
    }

    fn verify_at(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let mut values = headers.get_all(&self.header).iter();
        let value = match (values.next(), values.next()) {
            (Some(v), None) => v.as_bytes(),
            (None, _) => return Err(SignatureError::Missing(self.header.clone())),
            _ => return Err(SignatureError::Malformed(self.header.clone())),
        };
        let malformed = || SignatureError::Malformed(self.header.clone());
        match self.kind {
            WebhookKind::Stripe => self.verify_stripe(value, body, now),
            WebhookKind::Github => {
                let hex = value.strip_prefix(b"sha256=").ok_or_else(malformed)?;
                self.check(&[from_hex(hex).ok_or_else(malformed)?], &[body])
            }
            WebhookKind::Shopify => {
                let mac = base64::engine::general_purpose::STANDARD
                    .decode(value)
                    .map_err(|_| malformed())?;
                self.check(&[mac], &[body])
            }
            WebhookKind::Hmac => {
                let value = value.strip_prefix(b"sha256=").unwrap_or(value);
                let mac = from_hex(value)
                    .or_else(|| base64::engine::general_purpose::STANDARD.decode(value).ok())
                    .ok_or_else(malformed)?;
                self.check(&[mac], &[body])
            }
        }
    }

    /// `Stripe-Signature: t=<unix time>,v1=<hex>[,v1=<hex>…]`: HMAC of
    /// `<t>.<body>`, and `t` within the tolerance of now.
    fn verify_stripe(&self, value: &[u8], body: &[u8], now: i64) -> Result<(), SignatureError> {
        let malformed = || SignatureError::Malformed(self.header.clone());
        let text = std::str::from_utf8(value).map_err(|_| malformed())?;
        let mut timestamp = None;
        let mut macs = Vec::new();
        for part in text.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = Some(t),
                Some(("v1", mac)) => macs.push(from_hex(mac.as_bytes()).ok_or_else(malformed)?),
                _ => {}
            }
        }
        let t = timestamp.ok_or_else(malformed)?;
        let at: i64 = t.parse().map_err(|_| malformed())?;
        if macs.is_empty() {
            return Err(malformed());
        }
        self.check(&macs, &[t.as_bytes(), b".", body])?;
        let age = now.saturating_sub(at);
        if age.unsigned_abs() > self.tolerance.as_secs() {
            return Err(SignatureError::Expired {
                age_secs: age,
                tolerance_secs: self.tolerance.as_secs(),
            });
        }
        Ok(())
    }

    /// Whether any secret's HMAC over `parts` equals any of `macs`.
    fn check(&self, macs: &[Vec<u8>], parts: &[&[u8]]) -> Result<(), SignatureError> {
        for secret in self.secrets.get().iter() {
            let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
                continue;
            };
            for part in parts {
                mac.update(part);
            }
            // verify_slice compares in constant time.
            if macs.iter().any(|m| mac.clone().verify_slice(m).is_ok()) {
                return Ok(());
            }
        }
        Err(SignatureError::Mismatch)
    }
}

fn from_hex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// One secret per non-empty line.
fn parse_secrets(setting: &str, path: &Path, text: &str) -> Result<Vec<Vec<u8>>, ConfigError> {
    let secrets: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.as_bytes().to_vec())
        .collect();
    if secrets.is_empty() {
        return Err(ConfigError::new(
            setting,
            format!("{} is empty", path.display()),
            "write the sender's signing secret into it",
        ));
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn hook(kind: WebhookKind, secret: &str) -> Webhook {
        Webhook {
            kind,
            header: match kind {
                WebhookKind::Stripe => HeaderName::from_static("stripe-signature"),
                WebhookKind::Github => HeaderName::from_static("x-hub-signature-256"),
                WebhookKind::Shopify => HeaderName::from_static("x-shopify-hmac-sha256"),
                WebhookKind::Hmac => HeaderName::from_static("x-signature"),
            },
            secrets: secrets_file(&["other-secret", secret]),
            tolerance: Duration::from_secs(300),
            tenant: Tenant::parse(b"acme").unwrap(),
        }
    }

    fn secrets_file(lines: &[&str]) -> FileBacked<Vec<Vec<u8>>> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static FILES: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("dedupq-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILES.fetch_add(1, Ordering::Relaxed).to_string());
        std::fs::write(&path, lines.join("\n")).unwrap();
        FileBacked::load("secret_file", &path, |p, t| {
            parse_secrets("secret_file", p, t)
        })
        .unwrap()
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    // Reference values computed with `openssl dgst -sha256 -hmac`.
    const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
    const STRIPE_MAC: &str = "c0475716eb2200f1fe97fcf35a3c05d1fd4f8ba9a07a596730c8d18bb87c0672";

    #[test]
    fn a_stripe_signature_over_timestamp_and_body_is_accepted_within_the_tolerance() {
        let h = hook(WebhookKind::Stripe, "whsec_test_secret");
        let value = format!("t=1700000000,v1=00{},v1={STRIPE_MAC}", &STRIPE_MAC[2..]);
        let sig = headers("stripe-signature", &value);
        assert_eq!(h.verify_at(&sig, STRIPE_BODY, 1_700_000_100), Ok(()));
        assert_eq!(
            h.verify_at(
                &sig,
                br#"{"id":"evt_2","type":"charge.succeeded"}"#,
                1_700_000_100
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            h.verify_at(&sig, STRIPE_BODY, 1_700_000_301),
            Err(SignatureError::Expired {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        let other_t = headers("stripe-signature", &format!("t=1700000001,v1={STRIPE_MAC}"));
        assert_eq!(
            h.verify_at(&other_t, STRIPE_BODY, 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn githubs_documented_example_signature_is_accepted_and_a_wrong_secret_is_not() {
        let value = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let sig = headers("x-hub-signature-256", value);
        let good = hook(WebhookKind::Github, "It's a Secret to Everybody");
        assert_eq!(good.verify_at(&sig, b"Hello, World!", 0), Ok(()));
        let bad = hook(WebhookKind::Github, "It's a Secret to Nobody");
        assert_eq!(
            bad.verify_at(&sig, b"Hello, World!", 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn shopify_and_generic_signatures_are_read_as_base64_or_hex() {
        let shopify = hook(WebhookKind::Shopify, "shpss_secret");
        let sig = headers(
            "x-shopify-hmac-sha256",
            "xocA3LkeJ/RvNrkxep1EUtFHuj7rIoIqZYaLU26LyPQ=",
        );
        assert_eq!(shopify.verify_at(&sig, br#"{"id":1}"#, 0), Ok(()));
        let generic = hook(WebhookKind::Hmac, "Jefe");
        let hex = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let body = b"what do ya want for nothing?";
        for value in [hex.to_string(), format!("sha256={hex}")] {
            assert_eq!(
                generic.verify_at(&headers("x-signature", &value), body, 0),
                Ok(())
            );
        }
        assert_eq!(
            generic.verify_at(&HeaderMap::new(), body, 0),
            Err(SignatureError::Missing(HeaderName::from_static(
                "x-signature"
            )))
        );
        assert_eq!(
            generic.verify_at(&headers("x-signature", "not a mac"), body, 0),
            Err(SignatureError::Malformed(HeaderName::from_static(
                "x-signature"
            )))
        );
    }
}
