//! RabbitMQ for tests: settings with queue and exchange names of their own,
//! a client to publish with headers and properties, read reply and
//! dead-letter queues, and count what is left; the transport run in-process.

use super::unique;
use dedupq::broker::{
    self,
    amqp::{Outgoing, PublishError, Publisher},
};
use dedupq::config::SecretUrl;
use dedupq::engine::Engine;
use dedupq::health::Health;
use dedupq::transport::amqp::{self, AmqpError, AmqpSettings, QueueType};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Every test queue name starts with this; a policy expires such queues
/// ten minutes after their last use, so aborted runs do not pile up.
const PREFIX: &str = "dqt";

pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Settings with a fresh work queue, dead-letter exchange and queue, and
/// short delays so retries happen in milliseconds.
pub fn settings(queue_type: QueueType) -> AmqpSettings {
    AmqpSettings {
        queues: vec![unique(&format!("{PREFIX}_work"))],
        url: SecretUrl::new(amqp_url()),
        prefetch: 64,
        queue_type,
        dead_letter_exchange: unique(&format!("{PREFIX}_dlx")),
        dead_letter_queue: unique(&format!("{PREFIX}_dlq")),
        retry_delay_min: Duration::from_millis(50),
        retry_delay_max: Duration::from_secs(1),
        // With 1 s waits, trips that outlast twice the default 30 s lease
        // (the start-up check of `dedupq run`).
        max_redeliveries: 100,
        reconnect_backoff_min: Duration::from_millis(100),
        reconnect_backoff_max: Duration::from_secs(1),
        connection_name: "dedupq-test".into(),
        ..AmqpSettings::default()
    }
}

/// The `[amqp]` section of a `dedupq run` configuration for `s`.
pub fn config_section(s: &AmqpSettings) -> toml::Value {
    toml::Value::try_from(s).expect("AmqpSettings serialize to TOML")
}

/// The transport running in this process until `stop`.
pub struct Running {
    pub stop: CancellationToken,
    pub health: Health,
    task: JoinHandle<Result<(), AmqpError>>,
}

impl Running {
    pub fn start(settings: &AmqpSettings, engine: &Engine) -> Self {
        let stop = CancellationToken::new();
        let health = Health::default();
        let task = tokio::spawn(amqp::run(
            settings.clone(),
            std::sync::Arc::new(engine.clone()),
            health.clone(),
            stop.clone(),
        ));
        Self { stop, health, task }
    }

    /// Stops after the batch in hand; unacked deliveries go back to the queue.
    pub async fn stop(self) -> Result<(), AmqpError> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the transport stops within 30 s")
            .expect("the transport task did not panic")
    }
}

/// A message as a producer sends it.
#[derive(Debug, Clone, Default)]
pub struct Msg {
    pub tenant: Option<String>,
    pub key: Option<String>,
    pub body: Vec<u8>,
    pub message_id: Option<String>,
    pub reply_to: Option<String>,
    pub correlation_id: Option<String>,
    /// More header-table text entries, after the identity headers.
    pub extra_headers: Vec<(String, String)>,
}

impl Msg {
    pub fn new(tenant: &str, key: &str, body: &str) -> Self {
        Self {
            tenant: Some(tenant.into()),
            key: Some(key.into()),
            body: body.as_bytes().to_vec(),
            ..Self::default()
        }
    }

    /// The message with more header-table text entries.
    pub fn headers(mut self, extra: Vec<(String, String)>) -> Self {
        self.extra_headers.extend(extra);
        self
    }

    pub fn reply_to(mut self, queue: &str, correlation_id: &str) -> Self {
        self.reply_to = Some(queue.into());
        self.correlation_id = Some(correlation_id.into());
        self
    }

    fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(t) = &self.tenant {
            headers.insert("client-id".into(), text(t));
        }
        if let Some(k) = &self.key {
            headers.insert("idempotency-key".into(), text(k));
        }
        for (name, value) in &self.extra_headers {
            headers.insert(name.as_str().into(), text(value));
        }
        let mut p = BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2);
        if let Some(id) = &self.message_id {
            p = p.with_message_id(id.as_str().into());
        }
        if let Some(r) = &self.reply_to {
            p = p.with_reply_to(r.as_str().into());
        }
        if let Some(c) = &self.correlation_id {
            p = p.with_correlation_id(c.as_str().into());
        }
        p
    }
}

/// A message read back from a queue.
#[derive(Debug, Clone)]
pub struct Got {
    pub body: Vec<u8>,
    pub headers: BTreeMap<String, AMQPValue>,
    pub correlation_id: Option<String>,
    pub redelivered: bool,
}

impl Got {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// A header as text (strings) or decimal (integers).
    pub fn header(&self, name: &str) -> Option<String> {
        match self.headers.get(name)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            AMQPValue::LongLongInt(n) => Some(n.to_string()),
            AMQPValue::LongInt(n) => Some(n.to_string()),
            other => Some(format!("{other:?}")),
        }
    }
}

/// A test's own client connection (publisher confirms on).
pub struct Client {
    pub connection: Connection,
    publisher: Publisher,
    channel: Channel,
}

impl Client {
    pub async fn connect() -> Self {
        Self::connect_to(&amqp_url()).await
    }

    /// A client of the RabbitMQ at `url` (a test's private node).
    pub async fn connect_to(url: &str) -> Self {
        let connection = broker::amqp::connect(&AmqpSettings::at(url), "dedupq-test-client")
            .await
            .expect("connect to RabbitMQ");
        let publisher = Publisher::open(&connection).await.expect("confirm mode");
        let channel = publisher.channel().clone();
        ensure_expiry_policy().await;
        Self {
            connection,
            publisher,
            channel,
        }
    }

    /// A fresh non-durable queue for replies (expires with the policy).
    pub async fn reply_queue(&self) -> String {
        let name = unique(&format!("{PREFIX}_reply"));
        self.channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare reply queue");
        name
    }

    /// Publishes to the default exchange (i.e. straight into `queue`) and
    /// waits for the broker's confirm; like a careful producer, it sends
    /// again what the broker did not confirm (a loaded broker may nack).
    pub async fn publish(&self, queue: &str, msg: &Msg) {
        let out = Outgoing {
            exchange: String::new(),
            routing_key: queue.to_string(),
            payload: msg.body.clone(),
            properties: msg.properties(),
        };
        for attempt in 1..=5 {
            match self.publisher.publish(&out).await {
                Ok(()) => return,
                Err(e @ PublishError::Channel { .. }) => panic!("publish into {queue}: {e}"),
                Err(PublishError::Unconfirmed { .. }) => {}
            }
            assert!(attempt < 5, "published into {queue}: not confirmed 5 times");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Takes (and acks) every message now in `queue`.
    pub async fn drain(&self, queue: &str) -> Vec<Got> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get")
        {
            let d = m.delivery;
            d.acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack a read-back message");
            out.push(Got {
                body: d.data.clone(),
                headers: d
                    .properties
                    .headers()
                    .as_ref()
                    .map(|h| {
                        h.inner()
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default(),
                correlation_id: d
                    .properties
                    .correlation_id()
                    .as_ref()
                    .map(|c| c.to_string()),
                redelivered: d.redelivered,
            });
        }
        out
    }

    /// Waits until `queue` has yielded `n` messages in total, then checks
    /// that no more arrive for a short while; returns them all.
    pub async fn expect_exactly(&self, queue: &str, n: usize, limit: Duration) -> Vec<Got> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        while got.len() < n {
            got.extend(self.drain(queue).await);
            if tokio::time::Instant::now() > deadline {
                panic!("{queue}: {} of {n} messages after {limit:?}", got.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        got.extend(self.drain(queue).await);
        assert_eq!(got.len(), n, "{queue}: exactly {n} messages");
        got
    }

    /// Ready messages in `queue` (passive declare; unacked ones not counted).
    pub async fn ready(&self, queue: &str) -> u32 {
        let channel = self.connection.create_channel().await.expect("channel");
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue exists");
        let _ = channel.close(200, "counted".into()).await;
        q.message_count()
    }

    /// Deletes the test's queues and exchange (best effort).
    pub async fn cleanup(&self, s: &AmqpSettings) {
        let channel = self.connection.create_channel().await.expect("channel");
        let mut queues = s.queues.clone();
        queues.extend(s.queues.iter().map(|q| s.delay_queue(q)));
        queues.push(s.dead_letter_queue.clone());
        for q in queues {
            let _ = channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = channel
            .exchange_delete(
                s.dead_letter_exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A policy that deletes `dqt_*` queues unused for ten minutes (through the
/// management API; skipped quietly where it is not enabled).
async fn ensure_expiry_policy() {
    let api = std::env::var("RABBITMQ_MANAGEMENT_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:15672".into());
    let _ = reqwest::Client::new()
        .put(format!("{api}/api/policies/%2f/dedupq-test-expiry"))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({
            "pattern": format!("^{PREFIX}_"),
            "definition": { "expires": 600_000 },
            "apply-to": "queues",
            "priority": 0
        }))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
}

/// Forces every client connection closed, as an operator or a broker
/// failover would (`rabbitmqctl`, run as root).
pub fn close_all_connections() {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["close_all_connections", "test: forced close"])
        .output()
        .expect("run rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl close_all_connections failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
