//! Values that must never be printed or logged: URLs with credentials and
//! the secret librdkafka properties of `[kafka.client]`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// What a hidden value is replaced with.
pub(super) const HIDDEN: &str = "***";

/// A URL that may hold credentials (user info, or a `password`-like query
/// parameter such as PostgreSQL's `?password=`). Debug and Display never
/// show them; `expose` is for the one place that connects.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps `url` as it is; the start-up checks parse it.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its credentials, for the code that connects; never for
    /// output or logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({self})")
    }
}

/// `url` with its password and secret query parameters replaced by `***`.
/// Something that does not parse as a URL is hidden whole: it could be a
/// credential pasted into the wrong setting.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<unparsable url>".into();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some(HIDDEN));
    }
    // A user name without a password is often a token.
    if !parsed.username().is_empty() && parsed.password().is_none() {
        let _ = parsed.set_username(HIDDEN);
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let hidden = is_secret_name(&k);
                (
                    k.into_owned(),
                    if hidden { HIDDEN.into() } else { v.into() },
                )
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// Whether a setting or parameter name names a secret. Covers librdkafka's
/// `sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `ssl.key.pem` (an inline private key), `sasl.oauthbearer.client.secret`,
/// `sasl.oauthbearer.config`, PostgreSQL's `password` and `sslpassword`.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "passphrase", "token", "key.pem"]
        .iter()
        .any(|word| name.contains(word))
        || name == "sasl.oauthbearer.config"
}

/// A copy of librdkafka properties with the secret values hidden.
pub(super) fn redact_client(client: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    client
        .iter()
        .map(|(k, v)| {
            let v = if is_secret_name(k) {
                HIDDEN.to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_and_password_parameters_are_hidden_and_the_rest_kept() {
        let shown = redact_url(
            "postgres://app:pw1@db:5432/pay?sslmode=verify-full&password=pw2&sslpassword=pw3",
        );
        assert!(!shown.contains("pw1") && !shown.contains("pw2") && !shown.contains("pw3"));
        assert!(shown.contains("app:***@db:5432/pay"), "{shown}");
        assert!(shown.contains("sslmode=verify-full"), "{shown}");
    }

    #[test]
    fn secret_librdkafka_properties_are_recognised_and_others_are_not() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
        ] {
            assert!(is_secret_name(key), "{key}");
        }
        for key in ["sasl.username", "ssl.ca.location", "security.protocol"] {
            assert!(!is_secret_name(key), "{key}");
        }
    }
}
