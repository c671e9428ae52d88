//! Who is calling: the tenant comes from authentication, never from a
//! header the client picks. Either an API key from the keys file, or the
//! header a trusted gateway in front of dedupq sets.

use super::problem::Problem;
use super::reload::FileBacked;
use crate::config::{ApiSettings, ConfigError};
use crate::identity::Tenant;
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use subtle::ConstantTimeEq;

/// API keys shorter than this are refused at start-up (guessable).
const MIN_KEY_LEN: usize = 16;

pub(super) struct ApiKey {
    /// SHA-256 of the key: compared in constant time, and the same length
    /// whatever the presented key's length.
    digest: [u8; 32],
    tenant: Tenant,
}

pub(super) enum Callers {
    /// `api.keys_file`, read again when it changes (rotation without a
    /// restart).
    Keys(FileBacked<Vec<ApiKey>>),
    Gateway(HeaderName),
    /// Only webhook routes: their signature authenticates them.
    Nobody,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum AuthError {
    #[error("no credentials: send Authorization: Bearer <api key>")]
    Missing,
    #[error("the API key is not valid")]
    Unknown,
    #[error("the gateway sent no valid tenant in {0}")]
    NoTenant(HeaderName),
}

impl From<AuthError> for Problem {
    fn from(e: AuthError) -> Self {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "The caller is not authenticated",
            e.to_string(),
        )
        .with_header(header::WWW_AUTHENTICATE, "Bearer realm=\"dedupq\"")
    }
}

impl Callers {
    pub(super) fn load(api: &ApiSettings) -> Result<Self, ConfigError> {
        match (&api.keys_file, &api.tenant_header) {
            (Some(path), _) => {
                FileBacked::load("api.keys_file", path, parse_keys).map(Callers::Keys)
            }
            (None, Some(name)) => HeaderName::from_bytes(name.as_bytes())
                .map(Callers::Gateway)
                .map_err(|_| {
                    ConfigError::new(
                        "api.tenant_header",
                        "not a header name",
                        "use e.g. x-tenant",
                    )
                }),
            (None, None) => Ok(Callers::Nobody),
        }
    }

    /// Reads `api.keys_file` again if it changed (see `reload`).
    pub(super) fn reload_logged(&self) {
        if let Callers::Keys(file) = self {
            file.reload_logged();
        }
    }

    pub(super) fn tenant(&self, headers: &HeaderMap) -> Result<Tenant, AuthError> {
        match self {
            Callers::Keys(file) => {
                let keys = file.get();
                let presented = bearer(headers).ok_or(AuthError::Missing)?;
                let digest = Sha256::digest(presented.as_bytes());
                // Every entry is compared, so the time taken does not tell
                // which one matched.
                let mut found = None;
                for key in keys.iter() {
                    if bool::from(key.digest.ct_eq(digest.as_slice())) {
                        found = Some(&key.tenant);
                    }
                }
                found.cloned().ok_or(AuthError::Unknown)
            }
            Callers::Gateway(name) => {
                let mut values = headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (Some(v), None) => {
                        Tenant::parse(v.as_bytes()).map_err(|_| AuthError::NoTenant(name.clone()))
                    }
                    _ => Err(AuthError::NoTenant(name.clone())),
                }
            }
            Callers::Nobody => Err(AuthError::Missing),
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The keys file: a TOML table of `"<api key>" = "<tenant>"`. Errors name
/// the line, never the content (it is a secret).
fn parse_keys(path: &Path, text: &str) -> Result<Vec<ApiKey>, ConfigError> {
    let bad = |problem: String| {
        ConfigError::new(
            "api.keys_file",
            problem,
            "write one \"<api key>\" = \"<tenant>\" per line (TOML)",
        )
    };
    let table: BTreeMap<String, String> = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start].matches('\n').count() + 1)
            .unwrap_or(0);
        bad(format!(
            "{} line {line} is not a \"key\" = \"tenant\" pair",
            path.display()
        ))
    })?;
    if table.is_empty() {
        return Err(bad(format!("{} holds no keys", path.display())));
    }
    table
        .into_iter()
        .enumerate()
        .map(|(i, (key, tenant))| {
            let n = i + 1;
            if key.len() < MIN_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!(
                    "key #{n} (of tenant '{tenant}') must be at least {MIN_KEY_LEN} visible \
                     ASCII characters"
                )));
            }
            let tenant = Tenant::parse(tenant.as_bytes())
                .map_err(|e| bad(format!("key #{n}: tenant '{tenant}': {e}")))?;
            Ok(ApiKey {
                digest: Sha256::digest(key.as_bytes()).into(),
                tenant,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn keys() -> Callers {
        let dir = std::env::temp_dir().join(format!("dedupq-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("keys-{:?}.toml", std::thread::current().id()));
        std::fs::write(
            &path,
            "\"sk_test_acme_0123456789\" = \"acme\"\n\"sk_test_globex_0123456789\" = \"globex\"\n",
        )
        .unwrap();
        Callers::Keys(FileBacked::load("api.keys_file", &path, parse_keys).unwrap())
    }

    fn with_auth(value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn each_api_key_authenticates_its_own_tenant() {
        let c = keys();
        let t = c.tenant(&with_auth("Bearer sk_test_globex_0123456789"));
        assert_eq!(t.unwrap().as_str(), "globex");
        let t = c.tenant(&with_auth("bearer sk_test_acme_0123456789"));
        assert_eq!(t.unwrap().as_str(), "acme");
    }

    #[test]
    fn a_wrong_or_missing_key_authenticates_nobody() {
        let c = keys();
        assert!(matches!(
            c.tenant(&with_auth("Bearer sk_test_acme_012345678")),
            Err(AuthError::Unknown)
        ));
        assert!(matches!(
            c.tenant(&with_auth("Basic c2tfdGVzdA==")),
            Err(AuthError::Missing)
        ));
        assert!(matches!(
            c.tenant(&HeaderMap::new()),
            Err(AuthError::Missing)
        ));
    }

    #[test]
    fn a_gateway_header_sent_twice_names_no_tenant() {
        let c = Callers::Gateway(HeaderName::from_static("x-tenant"));
        let mut h = HeaderMap::new();
        h.append("x-tenant", HeaderValue::from_static("acme"));
        assert_eq!(c.tenant(&h).unwrap().as_str(), "acme");
        h.append("x-tenant", HeaderValue::from_static("globex"));
        assert!(c.tenant(&h).is_err());
    }
}
