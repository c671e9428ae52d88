//! After a scenario: every key charged once, every message accounted for,
//! no offset committed ahead of an unfinished message.

use super::publish::Coordinates;
use anyhow::Context;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// One key row as the check needs it.
#[derive(Debug, Clone)]
pub struct KeyState {
    pub status: String,
    pub attempts: i32,
    pub charge_id: Option<String>,
}

pub async fn key_states(pool: &PgPool) -> anyhow::Result<HashMap<String, KeyState>> {
    let rows = sqlx::query("SELECT tenant, key, status, attempts, result_body FROM dedupq_keys")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let derived = format!(
                "{}:{}",
                r.get::<String, _>("tenant"),
                r.get::<String, _>("key")
            );
            (
                derived,
                KeyState {
                    status: r.get("status"),
                    attempts: r.get("attempts"),
                    charge_id: charge_id(r.get("result_body")),
                },
            )
        })
        .collect())
}

/// The charge id in a stored provider answer (bytes as the provider sent
/// them), if the answer is JSON with an `id`.
fn charge_id(body: Option<Vec<u8>>) -> Option<String> {
    let v: Value = serde_json::from_slice(&body?).ok()?;
    match &v["id"] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct ChargeRow {
    pub id: i64,
    pub idempotency_key: Option<String>,
    pub attempt: Option<i32>,
    pub owner: Option<String>,
    pub state: String,
}

impl ChargeRow {
    /// The pid inside the owner name `host-pid-nonce`.
    fn owner_pid(&self) -> Option<u32> {
        self.owner.as_deref()?.rsplit('-').nth(1)?.parse().ok()
    }
}

pub async fn charges(provider: &str) -> anyhow::Result<Vec<ChargeRow>> {
    let v: Value = reqwest::get(format!("{provider}/charges"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(serde_json::from_value(v["charges"].clone())?)
}

#[derive(Debug, Default)]
pub struct ChargeCheck {
    pub charged_keys: usize,
    /// Keys charged twice under one claim attempt, or without a claim: a
    /// dedup failure.
    pub double_charged: Vec<String>,
    /// Extra charges made by an attempt that was then abandoned (killed
    /// after the charge, or no answer): a provider that honours keys
    /// absorbs these; one that does not, cannot be protected from them.
    pub repeated_after_abandoned_attempt: usize,
    /// Of those, made by a process the scenario then SIGKILLed.
    pub repeated_by_killed_process: usize,
    pub missing: Vec<String>,
    pub unfinished: Vec<String>,
}

/// `expected`: the derived keys (`tenant:key`) of every unique payment.
pub fn check_charges(
    expected: &[String],
    keys: &HashMap<String, KeyState>,
    charges: &[ChargeRow],
    killed: &[u32],
) -> ChargeCheck {
    let mut by_key: HashMap<&str, Vec<&ChargeRow>> = HashMap::new();
    for c in charges.iter().filter(|c| c.state != "declined") {
        if let Some(k) = c.idempotency_key.as_deref() {
            by_key.entry(k).or_default().push(c);
        }
    }
    let mut out = ChargeCheck::default();
    for key in expected {
        let Some(state) = keys.get(key) else {
            out.missing.push(key.clone());
            continue;
        };
        if state.status != "done" {
            out.unfinished.push(format!("{key} ({})", state.status));
            continue;
        }
        let made = by_key.get(key.as_str()).cloned().unwrap_or_default();
        if made.is_empty() {
            out.missing.push(key.clone());
            continue;
        }
        out.charged_keys += 1;
        let mut per_attempt: BTreeMap<i32, usize> = BTreeMap::new();
        for c in &made {
            *per_attempt.entry(c.attempt.unwrap_or(0)).or_default() += 1;
        }
        let stored = state.charge_id.as_deref();
        if !made
            .iter()
            .any(|c| Some(format!("ch_{}", c.id).as_str()) == stored)
        {
            out.double_charged.push(format!(
                "{key}: the stored result names {stored:?}, not a charge of this key"
            ));
            continue;
        }
        let twice_in_one_attempt = per_attempt.values().any(|n| *n > 1);
        let beyond_claims = per_attempt.keys().any(|a| *a > state.attempts || *a < 1);
        if twice_in_one_attempt || beyond_claims {
            out.double_charged.push(format!(
                "{key}: charges per attempt {per_attempt:?}, claims {}",
                state.attempts
            ));
        } else {
            out.repeated_after_abandoned_attempt += made.len() - 1;
            out.repeated_by_killed_process += made
                .iter()
                .filter(|c| Some(format!("ch_{}", c.id).as_str()) != stored)
                .filter(|c| c.owner_pid().is_some_and(|pid| killed.contains(&pid)))
                .count();
        }
    }
    out
}

fn kafka_consumer(brokers: &str, group: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .context("creating a Kafka consumer for checks")
}

/// (committed offset, high watermark) per partition of `topic` for `group`.
pub fn committed_and_end(
    brokers: &str,
    topic: &str,
    group: &str,
    partitions: i32,
) -> anyhow::Result<Vec<(i64, i64)>> {
    let consumer = kafka_consumer(brokers, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    (0..partitions)
        .map(|p| {
            let c = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            Ok((c, high))
        })
        .collect()
}

/// Messages below a sampled committed offset whose key is still open: a
/// commit ran ahead of an unfinished message. Sound because key rows only
/// move forward: a key open now was open when the offset was committed.
pub fn commits_ahead(
    committed: &[(i64, i64)],
    published: &BTreeMap<Coordinates, Option<String>>,
    keys: &HashMap<String, KeyState>,
) -> Vec<String> {
    published
        .iter()
        .filter(|(at, _)| {
            committed
                .get(at.partition as usize)
                .is_some_and(|(c, _)| at.offset < *c)
        })
        .filter_map(|(at, key)| {
            let key = key.as_ref()?;
            let open = keys
                .get(key)
                .is_none_or(|s| s.status == "in_progress" || s.status == "unknown");
            open.then(|| {
                format!(
                    "partition {} offset {} ({key}) committed while open",
                    at.partition, at.offset
                )
            })
        })
        .collect()
}

/// Dead letters on a Kafka topic, by reason header.
pub fn kafka_dead_letters(brokers: &str, topic: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("dedupq-check-{}", rand::random::<u32>()),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let meta = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = meta
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    let mut end = 0;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap_or((0, 0));
        end += high - low;
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    let mut reasons = BTreeMap::new();
    if end == 0 {
        return Ok(reasons);
    }
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    while seen < end && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            seen += 1;
            let reason = m
                .headers()
                .and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "dedupq-reason")
                        .and_then(|h| h.value)
                })
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "<no reason>".into());
            *reasons.entry(reason).or_default() += 1;
        }
    }
    Ok(reasons)
}

/// Ready messages in each RabbitMQ queue (0 for a queue that is absent).
pub async fn amqp_depths(url: &str, queues: &[String]) -> anyhow::Result<Vec<u32>> {
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let mut out = Vec::new();
    for q in queues {
        let channel = conn.create_channel().await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let depth = match channel
            .queue_declare(q.as_str().into(), options, FieldTable::default())
            .await
        {
            Ok(queue) => queue.message_count(),
            Err(_) => 0,
        };
        let _ = channel.close(200, "checked".into()).await;
        out.push(depth);
    }
    let _ = conn.close(200, "checked".into()).await;
    Ok(out)
}

/// Dead letters in a RabbitMQ queue by reason header (drains it).
pub async fn amqp_dead_letters(url: &str, queue: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let mut reasons = BTreeMap::new();
    while let Ok(Some(msg)) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await
    {
        let reason = msg
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("dedupq-reason").cloned())
            .map(|v| match v {
                lapin::types::AMQPValue::LongString(s) => s.to_string(),
                other => format!("{other:?}"),
            })
            .unwrap_or_else(|| "<no reason>".into());
        *reasons.entry(reason).or_default() += 1;
        msg.delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    let _ = channel.close(200, "checked".into()).await;
    let _ = conn.close(200, "checked".into()).await;
    Ok(reasons)
}
