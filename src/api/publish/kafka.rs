//! The Kafka producer of async routes. A record counts as published only
//! once every in-sync replica has it.

use super::PublishError;
use crate::api::engine::Outgoing;
use crate::config::KafkaSettings;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::time::Duration;

/// Consumer-only properties a shared `[kafka.client]` may hold; a producer
/// would warn about each.
const CONSUMER_ONLY: [&str; 2] = ["enable.auto.commit", "enable.auto.offset.store"];

pub struct KafkaPublisher {
    producer: FutureProducer,
    /// Longest wait for room in librdkafka's local queue.
    queue_timeout: Duration,
}

impl KafkaPublisher {
    pub fn new(s: &KafkaSettings) -> Result<Self, rdkafka::error::KafkaError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &s.brokers)
            .set("client.id", "dedupq-api")
            // 202 is an acknowledgement that the command is durable: every
            // in-sync replica must have it.
            .set("acks", "all")
            // librdkafka's retries never write a command twice or reorder it.
            .set("enable.idempotence", "true")
            // Bounds one publish; the client gets 503 and retries the key.
            .set(
                "message.timeout.ms",
                s.produce_timeout.as_millis().max(1).to_string(),
            )
            // A request waits for its own record: do not hold it for a batch.
            .set("linger.ms", "1");
        for (k, v) in &s.client {
            if !CONSUMER_ONLY.contains(&k.as_str()) {
                c.set(k, v);
            }
        }
        Ok(Self {
            producer: c.create()?,
            queue_timeout: s.produce_timeout,
        })
    }

    /// Keyed by the idempotency key, so every copy of one command lands in
    /// the same partition and is consumed in order.
    pub async fn send(&self, topic: &str, m: &Outgoing) -> Result<(), PublishError> {
        let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
        for (key, value) in &m.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_slice()),
            });
        }
        let record = FutureRecord::to(topic)
            .key(m.key.as_bytes())
            .payload(m.body.as_slice())
            .headers(headers);
        self.producer
            .send(record, self.queue_timeout)
            .await
            .map(|_| ())
            .map_err(|(source, _)| PublishError::Kafka {
                topic: topic.to_string(),
                source,
            })
    }
}
