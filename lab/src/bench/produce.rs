//! The workload: payment commands with random 32-hex-digit keys (like
//! UUIDs, so inserts land all over the key index), produced to Kafka or
//! published to RabbitMQ the way a careful producer would (acks=all,
//! publisher confirms). Runs in the parent, never in a measured child.

use super::stats::now_us;
use anyhow::{anyhow, Context};
use dedupq::broker::amqp::{self, Outgoing, PublishError, Publisher};
use dedupq::broker::kafka;
use dedupq::config::{AmqpSettings, KafkaSettings};
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection};
use rand::Rng;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(super) const TENANT: &str = "bench";
/// In the duplicate mix, a key's second copy follows this many messages
/// after the first (a redelivery or a producer retry a little later).
const DUPLICATE_LAG: usize = 1000;
/// Unconfirmed RabbitMQ publishes in flight.
const CONFIRM_WINDOW: usize = 2000;

/// The messages of one run, in send order.
pub(super) struct Stream {
    keys: Vec<String>,
    order: Vec<usize>,
    stamps: Vec<Option<i64>>,
    partitions: i32,
}

impl Stream {
    /// `messages` messages; with `duplicates`, every key is sent twice.
    pub(super) fn new(messages: usize, duplicates: bool, partitions: i32) -> Self {
        let unique = if duplicates { messages / 2 } else { messages };
        let mut rng = rand::rng();
        let keys = (0..unique)
            .map(|_| format!("{:016x}{:016x}", rng.random::<u64>(), rng.random::<u64>()))
            .collect();
        let mut order = Vec::with_capacity(messages);
        for j in 0..unique {
            order.push(j);
            if duplicates && j >= DUPLICATE_LAG {
                order.push(j - DUPLICATE_LAG);
            }
        }
        if duplicates {
            order.extend(unique.saturating_sub(DUPLICATE_LAG)..unique);
        }
        Self {
            keys,
            order,
            stamps: vec![None; unique],
            partitions: partitions.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// The keys sent with a stamp, and when they were first sent.
    pub(super) fn stamped(&self) -> Vec<(String, i64)> {
        self.keys
            .iter()
            .zip(&self.stamps)
            .filter_map(|(k, s)| s.filter(|t| *t > 0).map(|t| (k.clone(), t)))
            .collect()
    }

    /// Key, partition and body of the `i`-th message. The body carries the
    /// wall-clock time of the key's first send (`stamp`: now; else 0, which
    /// the consumers leave out of the latency); a duplicate repeats its
    /// original byte for byte, as a redelivery would.
    pub(super) fn message(&mut self, i: usize, stamp: bool) -> (&str, i32, Vec<u8>) {
        let j = self.order[i];
        let sent = *self.stamps[j].get_or_insert_with(|| if stamp { now_us() } else { 0 });
        let body = format!(
            r#"{{"amount":{},"currency":"EUR","recipient":"acct-{}","purpose":"invoice {}","sent_at_us":{}}}"#,
            100 + j % 9000,
            j % 997,
            j,
            sent
        );
        (
            &self.keys[j],
            (j as i32) % self.partitions,
            body.into_bytes(),
        )
    }
}

/// Counts failed deliveries; a benchmark over lost messages would lie.
#[derive(Default)]
pub(super) struct Counting {
    failed: AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A Kafka producer as a careful payment producer configures it. One per
/// run, so a paced run's first messages do not wait for its connection.
pub(super) struct KafkaProducer {
    producer: ThreadedProducer<Counting>,
    topic: String,
}

impl KafkaProducer {
    pub(super) fn new(brokers: &str, topic: &str) -> anyhow::Result<Self> {
        let producer = kafka::client(&KafkaSettings::at(brokers), "dedupq-bench-producer")
            .set("acks", "all")
            .set("enable.idempotence", "true")
            // Batches fill up under load anyway; a lone message leaves at once.
            .set("linger.ms", "0")
            .set("queue.buffering.max.messages", "1000000")
            .create_with_context(Counting::default())
            .context("creating the Kafka producer")?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }

    /// Sends `stream[range]`, blocking; paced at `rate` messages per second
    /// if given, else as fast as the client takes them. Returns once the
    /// broker acknowledged every message.
    pub(super) fn send(
        &self,
        stream: &mut Stream,
        range: std::ops::Range<usize>,
        rate: Option<f64>,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        let first = range.start;
        for i in range {
            if let Some(rate) = rate {
                pace(start, i - first, rate);
            }
            let (key, partition, body) = stream.message(i, rate.is_some());
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "client-id",
                    value: Some(TENANT),
                })
                .insert(Header {
                    key: "idempotency-key",
                    value: Some(key),
                });
            let mut record = BaseRecord::to(&self.topic)
                .key(key)
                .partition(partition)
                .payload(&body)
                .headers(headers);
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((e, back)) if is_queue_full(&e) => {
                        record = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(anyhow!("producing to {}: {e}", self.topic)),
                }
            }
        }
        self.producer
            .flush(Duration::from_secs(120))
            .context("flushing the producer")?;
        let failed = self.producer.context().failed.load(Ordering::Relaxed);
        anyhow::ensure!(
            failed == 0,
            "{failed} messages were not delivered to {}",
            self.topic
        );
        Ok(())
    }
}

/// Sleeps until message `n` of a run at `rate`/s is due; short waits are
/// skipped (sleeping costs more than they are worth), so sends come in
/// bursts of at most half a millisecond.
fn pace(start: Instant, n: usize, rate: f64) {
    let due = start + Duration::from_secs_f64(n as f64 / rate);
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        if wait > Duration::from_micros(500) {
            std::thread::sleep(wait);
        }
    }
}

fn is_queue_full(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
}

/// A confirming RabbitMQ publisher; one per run, like the Kafka one.
pub(super) struct AmqpPublisher {
    connection: Connection,
    publisher: Publisher,
    queue: String,
}

impl AmqpPublisher {
    pub(super) async fn new(url: &str, queue: &str) -> anyhow::Result<Self> {
        let connection = amqp::connect(&AmqpSettings::at(url), "dedupq-bench-publisher")
            .await
            .context("connecting to RabbitMQ")?;
        let publisher = Publisher::open(&connection).await?;
        Ok(Self {
            connection,
            publisher,
            queue: queue.to_string(),
        })
    }

    /// Publishes `stream[range]` (persistent, mandatory), paced at `rate`
    /// if given. Returns once every publish is confirmed.
    pub(super) async fn send(
        &self,
        stream: &mut Stream,
        range: std::ops::Range<usize>,
        rate: Option<f64>,
    ) -> anyhow::Result<()> {
        let mut pending = FuturesUnordered::new();
        let start = Instant::now();
        let first = range.start;
        for i in range {
            if let Some(rate) = rate {
                let due = start + Duration::from_secs_f64((i - first) as f64 / rate);
                if due > Instant::now() + Duration::from_micros(500) {
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            let (key, _, body) = stream.message(i, rate.is_some());
            let mut headers = BTreeMap::new();
            headers.insert(
                ShortString::from("client-id"),
                AMQPValue::LongString(TENANT.into()),
            );
            headers.insert(
                ShortString::from("idempotency-key"),
                AMQPValue::LongString(key.into()),
            );
            let out = Outgoing {
                exchange: String::new(),
                routing_key: self.queue.clone(),
                payload: body.to_vec(),
                properties: BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into())
                    .with_headers(FieldTable::from(headers)),
            };
            pending.push(self.publisher.send(&out).await?.confirmed());
            while pending.len() >= CONFIRM_WINDOW {
                confirmed(pending.next().await)?;
            }
        }
        while !pending.is_empty() {
            confirmed(pending.next().await)?;
        }
        Ok(())
    }

    pub(super) async fn close(self) {
        let _ = self.connection.close(200, "published".into()).await;
    }
}

fn confirmed(c: Option<Result<(), PublishError>>) -> anyhow::Result<()> {
    Ok(c.unwrap_or(Ok(()))?)
}
