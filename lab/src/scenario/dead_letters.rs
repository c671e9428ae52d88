//! The dead letters of a scenario, read back from both transports: each
//! with its reason and, when dedupq parsed the message that far, its
//! derived key (to hold against the provider's ledger).

use dedupq::broker::amqp::raw::{FieldValue, RawAmqp};
use dedupq::broker::kafka::{self, headers};
use dedupq::config::{AmqpSettings, KafkaSettings};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeadLetter {
    /// `dedupq-reason`, the broker's `x-death` reason, or `<no reason>`.
    pub reason: String,
    /// `{dedupq-tenant}:{dedupq-key}`, when both headers are there.
    pub derived_key: Option<String>,
}

impl DeadLetter {
    fn new(reason: Option<String>, tenant: Option<String>, key: Option<String>) -> Self {
        Self {
            reason: reason.unwrap_or_else(|| "<no reason>".into()),
            derived_key: tenant.zip(key).map(|(t, k)| format!("{t}:{k}")),
        }
    }
}

/// Dead letters counted by reason.
pub(super) fn by_reason(letters: &[DeadLetter]) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    for l in letters {
        *reasons.entry(l.reason.clone()).or_default() += 1;
    }
    reasons
}

/// Dead letters of payments the provider charged, as `reason key`. A
/// `conflict` is left out: it is another operation under a charged key,
/// refused as it should be.
pub(super) fn of_charged(letters: &[DeadLetter], charged: impl Fn(&str) -> bool) -> Vec<String> {
    letters
        .iter()
        .filter(|l| l.reason != "conflict")
        .filter_map(|l| {
            let key = l.derived_key.as_deref()?;
            charged(key).then(|| format!("{} {key}", l.reason))
        })
        .collect()
}

/// Every dead letter on a Kafka topic.
pub(super) fn kafka(brokers: &str, topic: &str) -> anyhow::Result<Vec<DeadLetter>> {
    let group = format!("dedupq-check-{}", rand::random::<u32>());
    let consumer: BaseConsumer = kafka::reader(&KafkaSettings::at(brokers), &group).create()?;
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
    let mut letters = Vec::new();
    if end == 0 {
        return Ok(letters);
    }
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    while seen < end && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            seen += 1;
            // Read as bytes: a dead letter keeps the producer's header
            // names, which need not be UTF-8 (rdkafka's own reader panics).
            let headers = headers::of(&m);
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|h| h.name == name.as_bytes())
                    .and_then(|h| h.value.as_deref())
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            letters.push(DeadLetter::new(
                header("dedupq-reason"),
                header("dedupq-tenant"),
                header("dedupq-key"),
            ));
        }
    }
    Ok(letters)
}

/// Every dead letter in a RabbitMQ queue (drains it): the `dedupq-reason`
/// header, or for what the broker dead-lettered itself the reason of the
/// newest `x-death` entry. Read with the raw client: the queue holds
/// deliveries lapin cannot parse (non-UTF-8 properties), which would break
/// its connection.
pub(super) async fn amqp(url: &str, queue: &str) -> anyhow::Result<Vec<DeadLetter>> {
    let mut raw = RawAmqp::connect(&AmqpSettings::at(url), "dedupq-scenario-check").await?;
    let mut letters = Vec::new();
    while let Some(d) = raw.get(queue).await? {
        let text = |v: &FieldValue| match v {
            FieldValue::LongStr(s) => Some(String::from_utf8_lossy(s).into_owned()),
            _ => None,
        };
        let header = |name: &str| d.properties.header(name.as_bytes()).and_then(text);
        let death = match d.properties.header(b"x-death") {
            Some(FieldValue::Array(deaths)) => deaths.first().and_then(|e| match e {
                FieldValue::Table(t) => t.iter().find(|(k, _)| k == b"reason"),
                _ => None,
            }),
            _ => None,
        };
        letters.push(DeadLetter::new(
            header("dedupq-reason").or_else(|| death.and_then(|(_, v)| text(v))),
            header("dedupq-tenant"),
            header("dedupq-key"),
        ));
    }
    raw.close().await?;
    Ok(letters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(reason: &str, key: Option<&str>) -> DeadLetter {
        DeadLetter {
            reason: reason.into(),
            derived_key: key.map(str::to_string),
        }
    }

    #[test]
    fn a_dead_letter_of_a_charged_payment_is_found_unless_it_is_a_conflict() {
        let letters = [
            letter("exhausted_retries", Some("t:charged")),
            letter("conflict", Some("t:charged")),
            letter("exhausted_retries", Some("t:free")),
            letter("delivery_limit", None),
        ];
        let found = of_charged(&letters, |k| k == "t:charged");
        assert_eq!(found, vec!["exhausted_retries t:charged".to_string()]);
        assert_eq!(by_reason(&letters)["exhausted_retries"], 2);
    }
}
