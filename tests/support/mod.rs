//! Shared helpers for the integration tests: an isolated schema per test on
//! the real PostgreSQL, messages, and handlers that count their effects.
#![allow(dead_code)]

pub mod amqp;
pub mod cli;
pub mod endpoints;
pub mod forward;
pub mod handlers;
pub mod kafka;
pub mod kafka_acl;
pub mod kafka_raw;
pub mod outage;
pub mod payments;
pub mod pg_faults;
pub mod pg_pair;
pub mod pooler;
pub mod private_rabbit;
pub mod process;
pub mod provider_api;
pub mod rabbit_management;
pub mod raw_amqp;
pub mod small_disk;

use dedupq::config::{IdentitySettings, Settings, StoreSettings};
use dedupq::engine::{Engine, EngineOptions, Incoming, Parser, Source};
use dedupq::handler::Handler;
use dedupq::metrics::Metrics;
use dedupq::store::Store;
use rand::Rng;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh name for a schema, topic or queue.
pub fn unique(prefix: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("{prefix}_{n:016x}")
}

/// Store settings pointing at a new, migrated schema of its own.
pub async fn isolated_store() -> (Store, StoreSettings) {
    let settings = StoreSettings {
        url: dedupq::config::SecretUrl::new(database_url()),
        schema: Some(unique("t")),
        max_connections: 16,
        // More than the default one, so that every test crosses partitions.
        partitions: 16,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings).expect("valid store settings");
    store
        .migrate(settings.schema.as_deref())
        .await
        .expect("migrations apply on a fresh schema");
    (store, settings)
}

/// Engine options for tests: short leases so takeovers happen in seconds.
pub fn fast_options() -> EngineOptions {
    let defaults = EngineOptions::default();
    EngineOptions {
        owner: unique("worker"),
        lease: Duration::from_secs(2),
        renew_every: Duration::from_millis(500),
        handler_timeout: Duration::from_secs(30),
        backoff: dedupq::engine::Backoff {
            min: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        ..defaults
    }
}

pub fn engine(store: &Store, handler: Arc<dyn Handler>, options: EngineOptions) -> Engine {
    Engine::new(
        store.clone(),
        handler,
        Parser::new(&IdentitySettings::default()),
        options,
        Metrics::new(),
        CancellationToken::new(),
    )
}

pub fn default_settings() -> Settings {
    Settings::default()
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A delivery with the default headers (`client-id`, `idempotency-key`).
pub fn message(tenant: &str, key: &str, body: &str) -> Incoming {
    Incoming::new(
        Source::Direct {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        },
        body,
    )
    .with_header("client-id", tenant)
    .with_header("idempotency-key", key)
}

/// The claim of `msg` as the engine would send it.
pub fn claim_request<'a>(
    parsed: &'a dedupq::engine::Parsed,
    msg: &'a Incoming,
) -> dedupq::store::ClaimRequest<'a> {
    dedupq::store::ClaimRequest {
        identity: &parsed.identity,
        fingerprint: &parsed.fingerprint,
        body: &msg.body,
        content_type: msg.content_type.as_deref(),
        derived_key: &parsed.derived_key,
        route: parsed.route.as_deref(),
    }
}

/// Stored or returned bytes read as JSON (panics if they are not).
pub fn json_of(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).expect("the body is JSON")
}

/// The http handler aimed at `url`, otherwise with the default settings.
pub fn http_handler(url: &str, timeout: Duration) -> dedupq::handler::HttpHandler {
    dedupq::handler::HttpHandler::new(&dedupq::config::HandlerSettings {
        url: url.to_string(),
        timeout,
        ..Default::default()
    })
    .expect("valid handler settings")
}

/// Polls `check` until it returns Some, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fenced blocks of one language in a Markdown text.
pub fn fenced_blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    text.split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or("").to_string())
        .collect()
}

/// Rows in the key table of this store's schema.
pub async fn count_rows(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedupq_keys")
        .fetch_one(store.pool())
        .await
        .expect("count rows")
}
