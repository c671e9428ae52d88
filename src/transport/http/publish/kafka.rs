//! The Kafka producer of async routes. A record counts as published only
//! once every in-sync replica has it (`broker::kafka::producer`).

use super::PublishError;
use crate::broker::kafka::{self, headers, Producing, Renewing};
use crate::config::KafkaSettings;
use crate::message::Header;
use crate::transport::http::decide::Publication;
use rdkafka::producer::FutureRecord;
use std::time::Duration;

pub(crate) struct KafkaPublisher {
    /// Replaced when librdkafka makes it fatal: the next request is
    /// published on the new client.
    producer: Renewing,
    /// Longest wait for room in librdkafka's local queue.
    queue_timeout: Duration,
}

impl KafkaPublisher {
    pub(crate) fn new(s: &KafkaSettings) -> Result<Self, rdkafka::error::KafkaError> {
        Ok(Self {
            producer: Renewing::new(kafka::producer(s, Producing::Api))?,
            queue_timeout: s.produce_timeout,
        })
    }

    /// Keyed by the idempotency key, so every copy of one command lands in
    /// the same partition and is consumed in order.
    pub(crate) async fn send(&self, topic: &str, m: &Publication) -> Result<(), PublishError> {
        let mut list: Vec<Header> = m
            .headers
            .iter()
            .map(|(name, value)| Header::new(name.as_str(), value.as_slice()))
            .collect();
        // The request's own, which the consumer forwards with the body.
        if let Some(ct) = &m.content_type {
            list.push(Header::new("content-type", ct.as_bytes()));
        }
        let record = FutureRecord::to(topic)
            .key(m.key.as_bytes())
            .payload(m.body.as_slice())
            .headers(headers::owned(&list));
        self.producer
            .send(record, self.queue_timeout)
            .await
            .map_err(|source| PublishError::Kafka {
                topic: topic.to_string(),
                source,
            })
    }
}
