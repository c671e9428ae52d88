//! HTTP API settings (`[api]`): the listener, how callers authenticate,
//! its limits, and the routes `POST /v1/<name>`. Checked at start-up.

use crate::config::{ConfigError, Settings, TenantSource};
use crate::identity::Tenant;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `[api]`: the HTTP API, routes `POST /v1/<name>` in the same key space
/// as the brokers. Checked at start-up only when enabled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSettings {
    /// Off by default: nothing listens unless this is true.
    pub enabled: bool,
    /// `api.listen` (default `127.0.0.1:8080`): the API's address; it must
    /// differ from `http.listen`.
    pub listen: SocketAddr,
    /// TOML file of `"<api key>" = "<tenant>"` lines; callers send
    /// `Authorization: Bearer <api key>`. A secret: keep it out of the
    /// configuration file and readable by dedupq only.
    pub keys_file: Option<PathBuf>,
    /// Instead of API keys: the header a gateway in front of dedupq sets
    /// to the tenant it authenticated. Needs `trusted_gateway = true`.
    pub tenant_header: Option<String>,
    /// Says that every request reaches dedupq through a gateway that
    /// overwrites `tenant_header`; without it a client could name any tenant.
    pub trusted_gateway: bool,
    /// Request line and headers together, in bytes (431 beyond).
    pub max_header_bytes: usize,
    /// Header fields per request (431 beyond).
    pub max_headers: usize,
    /// Requests handled at once; more are answered 503 at once.
    pub max_requests_in_flight: usize,
    /// `api.max_connections` (default 4096): open client connections at
    /// most; past it new connections wait in the listen backlog until one
    /// closes, so idle keep-alive clients cannot exhaust file descriptors.
    pub max_connections: usize,
    /// A client must send its request line and headers within this; a
    /// keep-alive connection idle this long after its last answer is
    /// closed, so idle clients do not hold `api.max_connections` slots.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Reading the body and deciding the request; a sync route's handler
    /// keeps running past it (the answer is then 504, and a retry with the
    /// same key gets the result).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// On shutdown, how long in-flight requests may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// `[[api.routes]]` (default none): an enabled API needs at least one.
    pub routes: Vec<RouteSettings>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            keys_file: None,
            tenant_header: None,
            trusted_gateway: false,
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            max_requests_in_flight: 1024,
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(15),
            routes: Vec::new(),
        }
    }
}

/// What a route does with an accepted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// Claim, run the handler, store, answer with the stored result.
    #[default]
    Sync,
    /// Publish the command to a broker (confirmed), answer 202; the
    /// consumer claims it.
    Async,
}

/// The webhook senders whose signature and event id dedupq knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookKind {
    /// `Stripe-Signature: t=…,v1=…`; key: the event's body `/id`.
    Stripe,
    /// `X-Hub-Signature-256: sha256=…`; key: `X-GitHub-Delivery`.
    Github,
    /// `X-Shopify-Hmac-Sha256` (base64); key: `X-Shopify-Webhook-Id`.
    Shopify,
    /// HMAC-SHA256 of the body in `signature_header` (hex, `sha256=` hex or
    /// base64); key from `key_header` or `key_pointer`.
    Hmac,
}

/// Where an async route publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "snake_case", deny_unknown_fields)]
pub enum PublishTarget {
    /// A topic on `[kafka].brokers`, keyed by the idempotency key.
    Kafka {
        /// The topic; not empty.
        topic: String,
    },
    /// An exchange on `[amqp].url` ("" is the default exchange, where the
    /// routing key names the queue).
    Amqp {
        /// The exchange (default `""`); at most 255 bytes.
        #[serde(default)]
        exchange: String,
        /// The routing key; at most 255 bytes.
        routing_key: String,
    },
}

/// One `[[api.routes]]` entry: the route `POST /v1/<name>` and what it
/// does with a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    /// The route is `POST /v1/<name>`.
    pub name: String,
    /// `mode` (default `sync`): answer with the stored result, or publish
    /// to `publish` and answer 202.
    #[serde(default)]
    pub mode: RouteMode,
    /// Header carrying the key (default `Idempotency-Key`, or the webhook
    /// preset's event-id header).
    #[serde(default)]
    pub key_header: Option<String>,
    /// JSON pointer to the key in the body, used when the header is absent.
    #[serde(default)]
    pub key_pointer: Option<String>,
    /// A webhook route: the sender's signature is verified before any claim
    /// and the tenant is `tenant`.
    #[serde(default)]
    pub webhook: Option<WebhookKind>,
    /// File with the signing secret (one per line: several while rotating).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// `hmac` webhooks: the header carrying the signature.
    #[serde(default)]
    pub signature_header: Option<String>,
    /// `stripe` webhooks: the largest age of the signed timestamp.
    #[serde(default = "default_tolerance", with = "humantime_serde")]
    pub tolerance: Duration,
    /// Webhook routes: the tenant the signing secret belongs to.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Async routes: where the command goes.
    #[serde(default)]
    pub publish: Option<PublishTarget>,
}

fn default_tolerance() -> Duration {
    Duration::from_secs(300)
}

/// A route name is one URL path segment.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(super) fn check(s: &Settings) -> Result<(), ConfigError> {
    let api = &s.api;
    if api.listen == s.http.listen {
        return Err(ConfigError::new(
            "api.listen",
            format!("{} is also http.listen", api.listen),
            "give the API and the operator endpoint different ports",
        ));
    }
    if !matches!(s.identity.tenant, TenantSource::Header { .. }) {
        return Err(ConfigError::new(
            "identity.tenant",
            "the HTTP API passes the authenticated tenant in the tenant header, \
             but the tenant is read from elsewhere",
            "use from = \"header\" when [api] is enabled",
        ));
    }
    check_auth(api)?;
    check_limits(api)?;
    if api.routes.is_empty() {
        return Err(ConfigError::new(
            "api.routes",
            "no routes",
            "add at least one [[api.routes]] with a name",
        ));
    }
    for (i, route) in api.routes.iter().enumerate() {
        if api.routes[..i].iter().any(|r| r.name == route.name) {
            return Err(ConfigError::new(
                &format!("api.routes[{i}].name"),
                format!("'{}' is used twice", route.name),
                "give every route its own name",
            ));
        }
        check_route(i, route)?;
    }
    Ok(())
}

fn check_auth(api: &ApiSettings) -> Result<(), ConfigError> {
    match (&api.keys_file, &api.tenant_header) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            "api.tenant_header",
            "both api.keys_file and api.tenant_header are set",
            "authenticate callers one way: API keys, or a trusted gateway's header",
        )),
        (None, Some(_)) if !api.trusted_gateway => Err(ConfigError::new(
            "api.trusted_gateway",
            "api.tenant_header is set but the gateway is not declared trusted: \
             a header the client chooses is not authentication",
            "set trusted_gateway = true only if a gateway in front of dedupq authenticates \
             every caller and overwrites this header; otherwise use api.keys_file",
        )),
        (None, Some(h)) if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() => {
            Err(ConfigError::new(
                "api.tenant_header",
                format!("'{h}' is not a header name"),
                "use a name such as x-tenant",
            ))
        }
        (None, None) if api.routes.iter().any(|r| r.webhook.is_none()) => Err(ConfigError::new(
            "api.keys_file",
            "routes other than webhooks need callers to authenticate, and no way is set",
            "point api.keys_file at a TOML file of \"<api key>\" = \"<tenant>\", or set \
             api.tenant_header with api.trusted_gateway = true",
        )),
        _ => Ok(()),
    }
}

fn check_limits(api: &ApiSettings) -> Result<(), ConfigError> {
    // hyper refuses a read buffer under 8 KiB; headers must fit in it.
    if api.max_header_bytes < 8192 {
        return Err(ConfigError::new(
            "api.max_header_bytes",
            format!("{} is under 8192", api.max_header_bytes),
            "allow at least 8192 bytes (the default is 16384)",
        ));
    }
    let zero = [
        ("api.max_headers", api.max_headers == 0),
        (
            "api.max_requests_in_flight",
            api.max_requests_in_flight == 0,
        ),
        ("api.max_connections", api.max_connections == 0),
        ("api.header_timeout", api.header_timeout.is_zero()),
        ("api.request_timeout", api.request_timeout.is_zero()),
        ("api.shutdown_timeout", api.shutdown_timeout.is_zero()),
    ];
    match zero.iter().find(|(_, is_zero)| *is_zero) {
        Some((setting, _)) => Err(ConfigError::new(
            setting,
            "must be more than zero",
            "see the defaults in the configuration reference",
        )),
        None => Ok(()),
    }
}

fn check_route(i: usize, r: &RouteSettings) -> Result<(), ConfigError> {
    let at = |field: &str| format!("api.routes[{i}].{field}");
    let bad =
        |field: &str, problem: String, fix: &str| Err(ConfigError::new(&at(field), problem, fix));
    if !valid_name(&r.name) {
        return bad(
            "name",
            format!("'{}' is not a path segment", r.name),
            "use 1..=64 letters, digits, '-' or '_'",
        );
    }
    if let Some(p) = r.key_pointer.as_deref().filter(|p| !p.starts_with('/')) {
        return bad(
            "key_pointer",
            format!("'{p}' is not a JSON pointer"),
            "start it with '/', e.g. /id",
        );
    }
    if let Some(h) = r
        .key_header
        .as_deref()
        .filter(|h| axum::http::HeaderName::from_bytes(h.as_bytes()).is_err())
    {
        return bad(
            "key_header",
            format!("'{h}' is not a header name"),
            "use e.g. Idempotency-Key",
        );
    }
    match (r.mode, &r.publish) {
        (RouteMode::Async, None) => {
            return bad("publish", "an async route needs a destination".into(),
                "add publish = { to = \"kafka\", topic = \"…\" } or { to = \"amqp\", routing_key = \"…\" }")
        }
        (RouteMode::Sync, Some(_)) => {
            return bad("publish", "a sync route publishes nothing".into(), "remove it, or set mode = \"async\"")
        }
        (_, Some(PublishTarget::Kafka { topic })) if topic.is_empty() => {
            return bad("publish.topic", "is empty".into(), "name the Kafka topic")
        }
        (_, Some(PublishTarget::Amqp { exchange, routing_key }))
            if exchange.len() > 255 || routing_key.len() > 255 =>
        {
            return bad("publish", "exchange or routing_key is longer than 255 bytes".into(), "shorten it")
        }
        _ => {}
    }
    check_webhook(r, &at)
}

fn check_webhook(r: &RouteSettings, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    let Some(kind) = r.webhook else {
        if r.tenant.is_some() || r.secret_file.is_some() || r.signature_header.is_some() {
            return Err(ConfigError::new(
                &at("tenant"),
                "tenant, secret_file and signature_header belong to webhook routes; \
                 other routes take the tenant from the caller's authentication",
                "remove them, or set webhook = \"stripe\" | \"github\" | \"shopify\" | \"hmac\"",
            ));
        }
        return Ok(());
    };
    if r.secret_file.is_none() {
        return Err(ConfigError::new(
            &at("secret_file"),
            "a webhook route needs the sender's signing secret",
            "point it at a file holding the secret",
        ));
    }
    match r.tenant.as_deref().map(|t| Tenant::parse(t.as_bytes())) {
        Some(Ok(_)) => {}
        _ => {
            return Err(ConfigError::new(
                &at("tenant"),
                "a webhook route needs the tenant its secret belongs to",
                "set tenant to 1..=128 visible ASCII characters without ':'",
            ))
        }
    }
    if kind == WebhookKind::Stripe && r.tolerance.is_zero() {
        return Err(ConfigError::new(
            &at("tolerance"),
            "is zero",
            "Stripe's own default is 5m",
        ));
    }
    if kind == WebhookKind::Hmac {
        let header_ok = r
            .signature_header
            .as_deref()
            .is_some_and(|h| axum::http::HeaderName::from_bytes(h.as_bytes()).is_ok());
        if !header_ok {
            return Err(ConfigError::new(
                &at("signature_header"),
                "an hmac webhook needs the header that carries the signature",
                "set it, e.g. signature_header = \"X-Signature\"",
            ));
        }
        if r.key_header.is_none() && r.key_pointer.is_none() {
            return Err(ConfigError::new(
                &at("key_header"),
                "an hmac webhook needs to know where the event id is",
                "set key_header or key_pointer",
            ));
        }
    }
    Ok(())
}
