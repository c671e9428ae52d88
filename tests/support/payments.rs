//! A payment pipeline in this process for the outcome tests: the Kafka
//! transport on topics of its own, an engine on an isolated schema, and a
//! handler (normally the http handler aimed at the provider simulator).
//! What dedupq stored is read from the key table; what the provider saw
//! from its ledger.

pub mod amqp;

use super::kafka::{self, produce, Running};
use super::{eventually, isolated_store, unique};
use dedupq::config::{IdentitySettings, StoreSettings};
use dedupq::engine::{Engine, EngineOptions, Parser};
use dedupq::handler::Handler;
use dedupq::identity::{IdempotencyKey, Identity, Tenant};
use dedupq::metrics::Metrics;
use dedupq::store::{KeyRow, KeyStatus, Store};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const TENANT: &str = "acme";

/// How long a test waits for a state the pipeline should reach.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn identity(key: &str) -> Identity {
    Identity {
        tenant: Tenant::parse(TENANT.as_bytes()).expect("a valid tenant"),
        key: IdempotencyKey::parse(key.as_bytes()).expect("a valid key"),
    }
}

/// What differs between the pipelines of the tests.
pub struct Setup {
    pub handler: Arc<dyn Handler>,
    pub max_attempts: u32,
    pub identity: IdentitySettings,
    pub reply_topic: bool,
}

impl Setup {
    pub fn new(handler: impl Handler) -> Self {
        Self {
            handler: Arc::new(handler),
            max_attempts: 5,
            identity: IdentitySettings::default(),
            reply_topic: false,
        }
    }
}

/// An engine on `store` with fast leases and backoff (see `fast_options`).
pub fn engine_for(
    store: &Store,
    handler: Arc<dyn Handler>,
    max_attempts: u32,
    identity: &IdentitySettings,
) -> Engine {
    let options = EngineOptions {
        max_attempts,
        ..super::fast_options()
    };
    Engine::new(
        store.clone(),
        handler,
        Parser::new(identity),
        options,
        Metrics::new(),
        CancellationToken::new(),
    )
}

pub async fn row(store: &Store, key: &str) -> Option<KeyRow> {
    store.show_key(&identity(key)).await.expect("read the key")
}

/// Waits until the key's row satisfies `check`, and returns it.
pub async fn wait_row(
    store: &Store,
    key: &str,
    what: &str,
    check: impl Fn(&KeyRow) -> bool,
) -> KeyRow {
    eventually(WAIT, what, || async {
        row(store, key).await.filter(&check)
    })
    .await
}

pub async fn wait_status(store: &Store, key: &str, status: KeyStatus) -> KeyRow {
    let what = format!("key {key} is {}", status.as_str());
    wait_row(store, key, &what, |r| r.status == status).await
}

pub struct KafkaPayments {
    pub store: Store,
    pub store_settings: StoreSettings,
    pub engine: Engine,
    pub topic: String,
    pub dlq: String,
    pub reply_topic: Option<String>,
    pub group: String,
    producer: FutureProducer,
    running: Option<Running>,
}

impl KafkaPayments {
    pub async fn start(setup: Setup) -> Self {
        let (store, store_settings) = isolated_store().await;
        Self::start_on(store, store_settings, setup).await
    }

    /// The same on a store that already holds rows.
    pub async fn start_on(store: Store, store_settings: StoreSettings, setup: Setup) -> Self {
        let (topic, dlq) = kafka::topics("pay", 1).await;
        let reply_topic = if setup.reply_topic {
            let t = format!("{topic}.replies");
            kafka::create_topic(&t, 1).await;
            Some(t)
        } else {
            None
        };
        let group = unique("g");
        let engine = engine_for(&store, setup.handler, setup.max_attempts, &setup.identity);
        let mut settings = kafka::settings(&topic, &group);
        settings.reply_topic = reply_topic.clone();
        let running = Running::start(settings, engine.clone());
        Self {
            store,
            store_settings,
            engine,
            topic,
            dlq,
            reply_topic,
            group,
            producer: kafka::producer(),
            running: Some(running),
        }
    }

    /// Produces a payment command for `key` with `body` as is, plus
    /// `extra` headers; returns its offset.
    pub async fn send(&self, key: &str, body: &[u8], extra: &[(&str, &[u8])]) -> i64 {
        let mut headers = kafka::headers(TENANT, key);
        headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_vec())));
        produce(&self.producer, &self.topic, 0, &headers, body).await
    }

    pub async fn row(&self, key: &str) -> Option<KeyRow> {
        row(&self.store, key).await
    }

    /// Waits until the key's row satisfies `check`, and returns it.
    pub async fn wait_row(&self, key: &str, what: &str, check: impl Fn(&KeyRow) -> bool) -> KeyRow {
        wait_row(&self.store, key, what, check).await
    }

    pub async fn wait_status(&self, key: &str, status: KeyStatus) -> KeyRow {
        wait_status(&self.store, key, status).await
    }

    /// Waits until every message produced so far has its offset committed.
    pub async fn wait_committed(&self) -> i64 {
        kafka::wait_committed_to_end(&self.group, &self.topic, 1, WAIT).await[0]
    }

    /// The first `n` dead letters.
    pub async fn dead_letters(&self, n: usize) -> Vec<OwnedMessage> {
        kafka::read(&self.dlq, 1, n, WAIT).await
    }

    /// The first `n` replies.
    pub async fn replies(&self, n: usize) -> Vec<OwnedMessage> {
        let topic = self.reply_topic.as_deref().expect("a reply topic");
        kafka::read(topic, 1, n, WAIT).await
    }

    /// Final decisions counted with this outcome label.
    pub fn outcomes(&self, outcome: &str) -> u64 {
        self.engine
            .metrics()
            .messages
            .with_label_values(&["kafka", outcome])
            .get()
    }

    /// A configuration file for `dedupq keys|dlq …` against this pipeline.
    pub fn cli_config(&self) -> PathBuf {
        let text = format!(
            "[store]\nurl = \"{url}\"\nschema = \"{schema}\"\n\
             [kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{brokers}\"\n\
             [retention]\nredelivery_horizon = \"1h\"\n",
            url = self.store_settings.url.expose(),
            schema = self.store_settings.schema.as_deref().unwrap_or("public"),
            topic = self.topic,
            brokers = kafka::brokers(),
        );
        super::cli::config_file(&text.parse().expect("valid TOML"))
    }

    /// Graceful stop: drain and commit.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await;
        }
    }
}

/// `base` (see `process::base_config`) plus a `[kafka]` section consuming
/// `topic` as `group`, with short timers.
pub fn kafka_process_config(base: &toml::Table, topic: &str, group: &str) -> toml::Table {
    let kafka: toml::Table = format!(
        "topics = [\"{topic}\"]\nbrokers = \"{brokers}\"\ngroup_id = \"{group}\"\n\
         commit_interval = \"200ms\"\nsession_timeout = \"6s\"\nstats_interval = \"1s\"\n",
        brokers = kafka::brokers()
    )
    .parse()
    .expect("kafka section");
    let mut config = base.clone();
    config.insert("kafka".into(), toml::Value::Table(kafka));
    config
}

/// The body of `/readyz` and whether it answered 200.
pub async fn readyz(http: std::net::SocketAddr) -> (bool, String) {
    let r = reqwest::get(format!("http://{http}/readyz"))
        .await
        .expect("GET /readyz");
    let ok = r.status().is_success();
    (ok, r.text().await.unwrap_or_default())
}
