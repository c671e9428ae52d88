//! Key retention against what a broker can replay. A key purged while the
//! broker still holds its message is a payment waiting to run again: a
//! consumer-group reset, a renamed group, or offsets expired after a week
//! idle replay the topic from `earliest`, and every purged key charges
//! again (providers forget their keys after a day or so too).

use crate::config::{ConfigError, Settings};

/// Refuses a `retention.keep` shorter than the longest replay of any
/// source topic (see `Replay`: retention.ms + segment.ms + the broker's
/// check; forever for a compacted topic or `retention.ms = -1`), unless
/// `retention.allow_shorter_than_topics` says the operator accepts it.
pub async fn check_kafka(settings: &Settings) -> anyhow::Result<()> {
    let keep = settings.retention.keep;
    let topics = crate::transport::kafka::topic_replays(&settings.kafka).await?;
    let problems: Vec<String> = topics
        .iter()
        .filter(|(_, replay)| replay.longest().is_none_or(|longest| longest > keep))
        .map(|(topic, replay)| format!("topic {topic} {replay}"))
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let problem = format!(
        "{} is shorter than what the broker can replay: {}; a consumer-group reset or a new \
         group would charge every purged key again",
        humantime::format_duration(keep),
        problems.join("; ")
    );
    if settings.retention.allow_shorter_than_topics {
        tracing::warn!(%problem, "retention.keep is shorter than the topics can replay (allowed by retention.allow_shorter_than_topics)");
        return Ok(());
    }
    Err(ConfigError::new(
        "retention.keep",
        problem,
        "keep keys at least as long as the topics can replay (or lower the topics' \
         retention.ms or segment.ms; a compacted topic replays forever); set \
         retention.allow_shorter_than_topics = true only if no consumer group can ever replay \
         past the kept keys",
    )
    .into())
}
