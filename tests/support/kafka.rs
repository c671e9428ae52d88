//! Kafka helpers for the integration tests: topics of their own, producing
//! payment commands with headers, reading topics back, committed offsets of
//! a group, and running the consumer in-process.

use super::{eventually, unique};
use dedupq::broker;
use dedupq::engine::Engine;
use dedupq::health::Health;
use dedupq::transport::kafka::{self, KafkaError, KafkaSettings};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Creates `name` with `partitions` partitions and waits until its
/// metadata shows every partition with a leader.
pub async fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]).await
}

/// `create_topic` with topic configs of its own (e.g. `cleanup.policy`).
pub async fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = broker::kafka::admin(&plain())
        .create()
        .expect("admin client");
    let topic = configs.iter().fold(
        NewTopic::new(name, partitions, TopicReplication::Fixed(1)),
        |topic, (key, value)| topic.set(key, value),
    );
    let results = admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create_topics request");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
    let name = name.to_string();
    eventually(Duration::from_secs(20), "topic metadata", || {
        let name = name.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let c = plain_consumer();
                let md = c.fetch_metadata(Some(&name), Duration::from_secs(2)).ok()?;
                let t = md.topics().first()?;
                (t.error().is_none()
                    && t.partitions().len() == partitions as usize
                    && t.partitions().iter().all(|p| p.leader() >= 0))
                .then_some(())
            })
            .await
            .ok()
            .flatten()
        }
    })
    .await;
}

/// A source topic and its dead-letter topic, with unique names.
pub async fn topics(prefix: &str, partitions: i32) -> (String, String) {
    let topic = unique(prefix);
    let dlq = format!("{topic}.dlq");
    create_topic(&topic, partitions).await;
    create_topic(&dlq, 1).await;
    (topic, dlq)
}

/// Settings reaching the plaintext listener.
fn plain() -> KafkaSettings {
    KafkaSettings::at(&brokers())
}

fn plain_consumer() -> BaseConsumer {
    broker::kafka::reader(&plain(), &unique("reader"))
        .create()
        .expect("reader consumer")
}

pub fn producer() -> FutureProducer {
    broker::kafka::client(&plain(), "dedupq-test")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .create()
        .expect("test producer")
}

/// The default identity headers of a payment command.
pub fn headers(tenant: &str, key: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        ("client-id".into(), tenant.as_bytes().to_vec()),
        ("idempotency-key".into(), key.as_bytes().to_vec()),
    ]
}

/// Produces one record to `partition` and waits for it; returns its offset.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    headers: &[(String, Vec<u8>)],
    payload: &[u8],
) -> i64 {
    let mut hs = OwnedHeaders::new();
    for (k, v) in headers {
        hs = hs.insert(Header {
            key: k,
            value: Some(v.as_slice()),
        });
    }
    let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
        .partition(partition)
        .payload(payload)
        .headers(hs);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map(|d| d.offset)
        .unwrap_or_else(|(e, _)| panic!("produce to {topic}/{partition}: {e}"))
}

/// Reads `topic` from the beginning until `count` records arrived.
pub async fn read(
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
) -> Vec<OwnedMessage> {
    read_with(plain_consumer(), topic, partitions, count, limit).await
}

/// `read` with a consumer of the caller's (e.g. one over SASL_SSL).
pub async fn read_with(
    c: BaseConsumer,
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
) -> Vec<OwnedMessage> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .expect("partition offset");
        }
        c.assign(&tpl).expect("assign");
        let deadline = std::time::Instant::now() + limit;
        let mut out = Vec::new();
        while out.len() < count {
            assert!(
                std::time::Instant::now() < deadline,
                "read {} of {count} records from {topic} in {limit:?}",
                out.len()
            );
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                out.push(m.detach());
            }
        }
        out
    })
    .await
    .expect("reader thread")
}

pub fn header<'a>(m: &'a OwnedMessage, name: &str) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

pub fn header_str(m: &OwnedMessage, name: &str) -> String {
    String::from_utf8_lossy(header(m, name).unwrap_or_default()).into_owned()
}

/// High watermark (one past the last record) of each partition.
pub async fn end_offsets(topic: &str, partitions: i32) -> Vec<i64> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let c = plain_consumer();
        (0..partitions)
            .map(|p| {
                c.fetch_watermarks(&topic, p, Duration::from_secs(5))
                    .expect("watermarks")
                    .1
            })
            .collect()
    })
    .await
    .expect("watermark thread")
}

/// Offsets `group` committed for each partition (-1: none).
pub async fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    try_committed(group, topic, partitions)
        .await
        .expect("committed offsets")
}

/// [`committed`], or the error of a broker that cannot answer yet (its
/// group coordinator still loading after a restart).
pub async fn try_committed(
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<i64>, rdkafka::error::KafkaError> {
    let (group, topic) = (group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = broker::kafka::reader(&plain(), &group)
            .create()
            .expect("offsets consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(5))?;
        Ok((0..partitions)
            .map(
                |p| match got.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => -1,
                },
            )
            .collect())
    })
    .await
    .expect("offsets thread")
}

/// Waits until `group` has committed every partition of `topic` up to its
/// end, and returns the end offsets.
pub async fn wait_committed_to_end(
    group: &str,
    topic: &str,
    partitions: i32,
    limit: Duration,
) -> Vec<i64> {
    let end = end_offsets(topic, partitions).await;
    eventually(limit, "group committed every partition to its end", || {
        let end = end.clone();
        async move {
            let now = try_committed(group, topic, partitions).await.ok()?;
            (now == end).then_some(end)
        }
    })
    .await
}

/// Produces payments `pay-0` … `pay-{n-1}` of `tenant` (bodies from
/// `body`) to `topic`, spread over its `partitions`, one every `pace`, in a
/// task of its own, so that they keep coming while a test does something
/// to the processes consuming them.
pub fn paced_payments(
    topic: &str,
    partitions: i32,
    tenant: &str,
    n: usize,
    pace: Duration,
    body: impl Fn(usize) -> Vec<u8> + Send + 'static,
) -> JoinHandle<()> {
    let (topic, tenant) = (topic.to_string(), tenant.to_string());
    tokio::spawn(async move {
        let producer = producer();
        for k in 0..n {
            let partition = (k % partitions as usize) as i32;
            let key = format!("pay-{k}");
            produce(
                &producer,
                &topic,
                partition,
                &headers(&tenant, &key),
                &body(k),
            )
            .await;
            tokio::time::sleep(pace).await;
        }
    })
}

/// Consumer settings for tests: short timers so rebalances and commits
/// happen in a second or two.
pub fn settings(topic: &str, group: &str) -> KafkaSettings {
    KafkaSettings {
        topics: vec![topic.to_string()],
        brokers: brokers(),
        group_id: group.to_string(),
        batch_linger: Duration::from_millis(5),
        commit_interval: Duration::from_millis(200),
        session_timeout: Duration::from_secs(6),
        stats_interval: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(10),
        produce_timeout: Duration::from_secs(10),
        client: BTreeMap::new(),
        ..KafkaSettings::default()
    }
}

/// The Kafka transport running in this process.
pub struct Running {
    pub health: Health,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), KafkaError>>>,
}

impl Running {
    pub fn start(settings: KafkaSettings, engine: Engine) -> Self {
        let health = Health::default();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kafka::run(
            settings,
            std::sync::Arc::new(engine),
            health.clone(),
            shutdown.clone(),
        ));
        Self {
            health,
            shutdown,
            task: Some(task),
        }
    }

    /// Graceful stop: drain, commit, leave the group.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await
                .expect("kafka task did not panic")
                .expect("kafka transport stopped cleanly");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// `base` plus a `[kafka]` section consuming `topic` as `group`, with
/// short test timers; `extra` is more TOML for that section.
pub fn with_kafka(base: &toml::Table, topic: &str, group: &str, extra: &str) -> toml::Table {
    let kafka: toml::Table = format!(
        r#"
topics = ["{topic}"]
brokers = "{brokers}"
group_id = "{group}"
commit_interval = "200ms"
session_timeout = "6s"
stats_interval = "1s"
{extra}
"#,
        brokers = brokers()
    )
    .parse()
    .expect("kafka section");
    let mut config = base.clone();
    config.insert("kafka".into(), toml::Value::Table(kafka));
    config
}
