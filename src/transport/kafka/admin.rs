//! Start-up checks against the cluster: the topics dedupq produces to
//! exist (or are created when allowed), and how long the source topics can
//! replay.

use super::error::KafkaError;
use super::replay::{CheckInterval, Replay};
use crate::backoff::{self, Backoff, Gave};
use crate::config::KafkaSettings;
use crate::health::{Component, Health};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::metadata::Metadata;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the start-up `request` (`what` it does, for the log) until a
/// broker answers it. While none can be reached (the cluster restarting,
/// dedupq started first), the transport is down on /readyz with the cause
/// and the request is tried again after a growing wait; any other error
/// ends it. `Gave::Stopped` once `shutdown` is cancelled meanwhile.
pub(crate) async fn when_reachable<T, Fut>(
    what: &str,
    health: &Health,
    shutdown: &CancellationToken,
    request: impl FnMut() -> Fut,
) -> Result<T, Gave<KafkaError>>
where
    Fut: Future<Output = Result<T, KafkaError>>,
{
    let answered = backoff::wait_out(
        Backoff::new(Duration::from_millis(500), Duration::from_secs(10)),
        shutdown,
        KafkaError::is_unreachable,
        |e, attempt, delay| {
            let cause = crate::telemetry::chain(e).to_string();
            tracing::warn!(error = %cause, attempt, ?delay, "Kafka not reachable yet ({what}); retrying");
            health.set_down(Component::Kafka, format!("unreachable ({what}): {cause}"));
        },
        request,
    )
    .await;
    if answered.is_ok() {
        health.set_down(Component::Kafka, "starting");
    }
    answered
}

fn admin(settings: &KafkaSettings) -> Result<AdminClient<DefaultClientContext>, KafkaError> {
    crate::broker::kafka::admin(settings)
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
pub(super) async fn ensure_produced_topics(s: &KafkaSettings) -> Result<(), KafkaError> {
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

fn metadata(admin: &AdminClient<DefaultClientContext>) -> Result<Metadata, KafkaError> {
    let client = admin.inner();
    // A metadata fetch blocks the thread; keep it off the async workers.
    super::context::block(|| client.fetch_metadata(None, METADATA_TIMEOUT))
        .map_err(KafkaError::Admin)
}

async fn existing_topics(
    admin: &AdminClient<DefaultClientContext>,
) -> Result<HashSet<String>, KafkaError> {
    Ok(metadata(admin)?
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .collect())
}

/// The cluster as its metadata shows it: for `dedupq check`.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Brokers in the metadata.
    pub brokers: usize,
    /// Every topic this client may see, with its partition count.
    pub topics: HashMap<String, usize>,
}

/// Fetches the cluster's metadata with the configured client (so TLS and
/// SASL are tried as the consumer will use them).
pub async fn cluster(s: &KafkaSettings) -> Result<Cluster, KafkaError> {
    let metadata = metadata(&admin(s)?)?;
    Ok(Cluster {
        brokers: metadata.brokers().len(),
        topics: metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_string(), t.partitions().len()))
            .collect(),
    })
}

/// How long each source topic can replay (see `Replay`).
pub async fn topic_replays(s: &KafkaSettings) -> Result<Vec<(String, Replay)>, KafkaError> {
    let admin = admin(s)?;
    let check = check_interval(&admin).await?;
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
        let configs = resource
            .entries
            .iter()
            .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
            .collect();
        out.push((topic.clone(), Replay::from_configs(&configs, check)));
    }
    Ok(out)
}

/// The longest `log.retention.check.interval.ms` of the brokers; Kafka's
/// default if none can be read (describing a broker may be denied on a
/// managed cluster).
async fn check_interval(
    admin: &AdminClient<DefaultClientContext>,
) -> Result<CheckInterval, KafkaError> {
    let brokers: Vec<i32> = metadata(admin)?.brokers().iter().map(|b| b.id()).collect();
    let mut longest: Option<Duration> = None;
    // librdkafka takes one broker resource per request.
    for broker in brokers {
        let spec = [ResourceSpecifier::Broker(broker)];
        let every = match admin.describe_configs(&spec, &AdminOptions::new()).await {
            Ok(mut results) => results.pop().and_then(Result::ok).and_then(|r| {
                r.get("log.retention.check.interval.ms")?
                    .value
                    .as_deref()?
                    .parse::<u64>()
                    .ok()
            }),
            Err(e) => {
                tracing::debug!(broker, error = %e, "broker config not readable");
                None
            }
        };
        if let Some(ms) = every {
            longest = longest.max(Some(Duration::from_millis(ms)));
        }
    }
    Ok(
        longest.map_or(CheckInterval::KAFKA_DEFAULT, |every| CheckInterval {
            every,
            from_broker: true,
        }),
    )
}
