//! Key retention against what a broker can replay. A key purged while the
//! broker still holds its message is a payment waiting to run again: a
//! consumer-group reset, a renamed group, or offsets expired after a week
//! idle replay the topic from `earliest`, and every purged key charges
//! again (providers forget their keys after a day or so too).

use crate::config::{ConfigError, Settings};

/// Refuses a `retention.keep` shorter than any source topic's
/// `retention.ms` (forever counts as longer than any keep), unless
/// `retention.allow_shorter_than_topics` says the operator accepts it.
pub async fn check_kafka(settings: &Settings) -> anyhow::Result<()> {
    let keep = settings.retention.keep;
    let topics = crate::transport::kafka::topic_retention(&settings.kafka).await?;
    let problems: Vec<String> = topics
        .iter()
        .filter(|(_, kept)| kept.is_none_or(|k| k > keep))
        .map(|(topic, kept)| {
            format!(
                "topic {topic} keeps messages for {} (retention.ms)",
                kept.map_or("ever".into(), |k| humantime::format_duration(k).to_string())
            )
        })
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
        tracing::warn!(%problem, "retention.keep is shorter than the topics' retention (allowed by retention.allow_shorter_than_topics)");
        return Ok(());
    }
    Err(ConfigError::new(
        "retention.keep",
        problem,
        "keep keys at least as long as the topics keep messages (or lower the topics' \
         retention.ms); set retention.allow_shorter_than_topics = true only if no consumer \
         group can ever replay past the kept keys",
    )
    .into())
}
