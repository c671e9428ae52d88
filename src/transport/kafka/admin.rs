//! Start-up checks against the cluster: the topics dedupq produces to
//! exist (or are created when allowed), and the key retention covers what
//! the broker can replay.

use super::client;
use super::error::KafkaError;
use crate::config::KafkaSettings;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use std::collections::HashSet;
use std::time::Duration;

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

fn admin(settings: &KafkaSettings) -> Result<AdminClient<DefaultClientContext>, KafkaError> {
    client::admin_config(settings)
        .create()
        .map_err(KafkaError::Client)
}

/// Topics dedupq produces to: the dead-letter topic of every source topic,
/// and the reply topic.
pub fn produced_topics(s: &KafkaSettings) -> Vec<String> {
    s.topics
        .iter()
        .map(|t| format!("{t}{}", s.dlq_suffix))
        .chain(s.reply_topic.clone())
        .collect()
}

/// Every topic dedupq produces to must exist: a dead letter that cannot be
/// produced would hold its partition forever. Missing ones are created
/// when `kafka.create_topics` allows it.
pub async fn ensure_produced_topics(s: &KafkaSettings) -> Result<(), KafkaError> {
    let admin = admin(s)?;
    let wanted = produced_topics(s);
    let existing = existing_topics(&admin).await?;
    let missing: Vec<&String> = wanted.iter().filter(|t| !existing.contains(*t)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !s.create_topics {
        return Err(KafkaError::Config {
            setting: "topics",
            problem: format!(
                "topic(s) {missing:?} that dedupq produces dead letters or replies to do not \
                 exist; create them, or set kafka.create_topics = true"
            ),
        });
    }
    let new: Vec<NewTopic> = missing
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(-1)))
        .collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new())
        .await
        .map_err(KafkaError::Admin)?;
    for r in results {
        match r {
            Ok(topic) => tracing::info!(%topic, "created topic"),
            Err((topic, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(%topic, "topic created meanwhile")
            }
            Err((topic, code)) => {
                return Err(KafkaError::Config {
                    setting: "create_topics",
                    problem: format!("creating topic {topic} failed: {code}"),
                })
            }
        }
    }
    Ok(())
}

async fn existing_topics(
    admin: &AdminClient<DefaultClientContext>,
) -> Result<HashSet<String>, KafkaError> {
    let client = admin.inner();
    // A metadata fetch blocks the thread; keep it off the async workers.
    let metadata = super::context::block(|| client.fetch_metadata(None, METADATA_TIMEOUT))
        .map_err(KafkaError::Admin)?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .collect())
}

/// The longest time the broker keeps each source topic's messages
/// (`retention.ms`; None: forever).
pub async fn topic_retention(
    s: &KafkaSettings,
) -> Result<Vec<(String, Option<Duration>)>, KafkaError> {
    let admin = admin(s)?;
    let specs: Vec<ResourceSpecifier> = s
        .topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t))
        .collect();
    let results = admin
        .describe_configs(&specs, &AdminOptions::new())
        .await
        .map_err(KafkaError::Admin)?;
    let mut out = Vec::new();
    for (topic, result) in s.topics.iter().zip(results) {
        let resource = result.map_err(|code| KafkaError::Config {
            setting: "topics",
            problem: format!("reading the configuration of topic {topic} failed: {code}"),
        })?;
        let ms = resource
            .entries
            .iter()
            .find(|e| e.name == "retention.ms")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(7 * 24 * 3600 * 1000);
        out.push((
            topic.clone(),
            (ms >= 0).then(|| Duration::from_millis(ms as u64)),
        ));
    }
    Ok(out)
}
