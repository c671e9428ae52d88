//! Handler settings (`[handler]`): where the work call goes and how.

use super::redact_url;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Which handler makes the work call (`handler.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerKind {
    /// POST to `handler.url` with the derived idempotency key.
    Http,
    /// `http` against the bundled provider simulator.
    Payment,
}

/// A value that may be a secret: given inline, or read from a file (a
/// Kubernetes or Docker secret) or an environment variable at start-up.
/// Never printed or logged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SecretValue {
    /// The value itself, written in the configuration.
    Inline(String),
    /// `{ file = "…" }`: read from a file at start-up.
    File {
        /// The file holding the value.
        file: PathBuf,
    },
    /// `{ env = "…" }`: read from an environment variable at start-up.
    Env {
        /// The variable's name.
        env: String,
    },
}

impl SecretValue {
    /// The value; files lose one trailing newline.
    pub fn resolve(&self) -> Result<String, String> {
        match self {
            SecretValue::Inline(v) => Ok(v.clone()),
            SecretValue::File { file } => std::fs::read_to_string(file)
                .map(|v| v.strip_suffix('\n').unwrap_or(&v).to_string())
                .map_err(|e| format!("reading {}: {e}", file.display())),
            SecretValue::Env { env } => {
                std::env::var(env).map_err(|_| format!("environment variable {env} is not set"))
            }
        }
    }

    /// The form `dedupq config` prints: where the value comes from, never
    /// the value.
    pub fn redacted(&self) -> Self {
        match self {
            SecretValue::Inline(_) => SecretValue::Inline("***".into()),
            other => other.clone(),
        }
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretValue::Inline(_) => f.write_str("SecretValue(***)"),
            SecretValue::File { file } => write!(f, "SecretValue(file {})", file.display()),
            SecretValue::Env { env } => write!(f, "SecretValue(env {env})"),
        }
    }
}

/// A target URL for the messages of one topic or queue (and tenant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerRoute {
    /// Kafka topic or RabbitMQ queue the message came from; any if absent.
    pub source: Option<String>,
    /// Tenant of the message; any if absent.
    pub tenant: Option<String>,
    /// Where the matching messages' calls go. May carry credentials:
    /// hidden in `dedupq config`.
    pub url: String,
}

/// `[handler]`: the work call made for each claimed key: its target,
/// timeout, headers and TLS.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandlerSettings {
    /// `handler.kind` (default `payment`). Both kinds run the same HTTP
    /// forwarder; `payment` names a payment provider's charge endpoint.
    pub kind: HandlerKind,
    /// `handler.url` (no default): where the work call goes unless a route
    /// says otherwise. `dedupq run` refuses to start without it (a
    /// forgotten `[handler]` must not send payments anywhere). May carry
    /// credentials: hidden in `dedupq config`, never logged.
    pub url: String,
    /// A file holding the URL (a Kubernetes or Docker secret); wins over
    /// `url`.
    pub url_file: Option<PathBuf>,
    /// Per-request timeout; must be shorter than the lease.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The request header carrying the derived key.
    pub key_header: String,
    /// Answers that mean dedupq is misconfigured (a rotated API key, a
    /// mistyped URL), not that the payment failed: never stored, retried
    /// with backoff, counted in `dedupq_handler_faults_total`. Redirects
    /// (3xx) always count as such.
    pub fault_statuses: Vec<u16>,
    /// Longest provider answer read; a longer body is not stored (its
    /// status is).
    pub max_response_bytes: usize,
    /// Message headers forwarded to the target as they are (e.g. trace
    /// context, webhook signatures); every other header stays behind.
    pub pass_headers: Vec<String>,
    /// Static request headers (e.g. `Authorization`), inline or from a
    /// secret file or environment variable: `{ file = "…" }`, `{ env = "…" }`.
    pub headers: BTreeMap<String, SecretValue>,
    /// Target URLs per topic/queue and tenant; the first match wins, then
    /// `url`.
    pub routes: Vec<HandlerRoute>,
    /// Asked before retrying a key whose earlier attempt may have charged:
    /// `{derived_key}` is replaced by the URL-encoded key. A 200 settles
    /// the key `done` with that answer only if it names the key: its body
    /// is JSON holding the derived key as a string value, at any depth
    /// (e.g. `"idempotency_key": "acme:pay-1"`). A 200 that does not name
    /// it is a lookup fault (logged) and settles nothing; then, as after a
    /// 404 (no charge) or no answer, the request is sent again with the
    /// same derived key. Checked at start-up: a lookup that answers 200 for
    /// a key never charged stops it; one not reachable then does not.
    pub lookup_url: Option<String>,
    /// PEM file of the CA that signs the target's certificate (added to
    /// the system roots).
    pub ca_file: Option<PathBuf>,
    /// PEM file with a client certificate and its private key, for targets
    /// that require mutual TLS.
    pub client_identity_file: Option<PathBuf>,
    /// `handler.retry_for` (default 20h): how long a key's attempts go on,
    /// from its first claim, before it is given up: a key whose attempts
    /// never reached the provider is left free and dead-lettered
    /// (`exhausted_retries`); one that may have charged is held `unknown`;
    /// one that keeps faulting is dead-lettered `handler_fault`. Time
    /// paused for a provider outage does not count. Keep it inside the
    /// provider's idempotency-key window (24 h at Stripe), so a retry is
    /// always recognised.
    #[serde(with = "humantime_serde")]
    pub retry_for: Duration,
    /// `handler.outage_after` (default 3): calls of this many different
    /// keys failing in a row (refused, 5xx, timeouts, faults) are a
    /// provider outage: intake pauses and one probe at a time tests the
    /// provider. A 429 or 503 with `Retry-After` pauses at once.
    pub outage_after: usize,
}

impl Default for HandlerSettings {
    fn default() -> Self {
        Self {
            kind: HandlerKind::Payment,
            url: String::new(),
            url_file: None,
            timeout: Duration::from_secs(10),
            key_header: "Idempotency-Key".into(),
            fault_statuses: vec![401, 403, 404, 405],
            max_response_bytes: 1024 * 1024,
            pass_headers: vec!["traceparent".into(), "tracestate".into()],
            headers: BTreeMap::new(),
            routes: Vec::new(),
            lookup_url: None,
            ca_file: None,
            client_identity_file: None,
            retry_for: Duration::from_secs(20 * 3600),
            outage_after: 3,
        }
    }
}

impl HandlerSettings {
    /// A copy safe to print: static header values and credentials in URLs
    /// hidden.
    pub fn redacted(&self) -> Self {
        let mut copy = self.clone();
        copy.url = redact_url(&self.url);
        copy.lookup_url = self.lookup_url.as_deref().map(redact_url);
        for route in &mut copy.routes {
            route.url = redact_url(&route.url);
        }
        for value in copy.headers.values_mut() {
            *value = value.redacted();
        }
        copy
    }
}
