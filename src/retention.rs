//! Key retention against what a broker can replay. A key purged while the
//! broker still holds its message is a payment waiting to run again: a
//! consumer-group reset, a renamed group, or offsets expired after a week
//! idle replay the topic from `earliest`, and every purged key charges
//! again (providers forget their keys after a day or so too).

use crate::backoff::Gave;
use crate::config::{ConfigError, Keep, Settings};
use crate::health::Health;
use crate::startup::StoppedDuringStartUp;
use crate::telemetry::chain;
use crate::transport::kafka::{self, Replay};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The shortest `auto` keep: a day.
const AUTO_FLOOR: Duration = Duration::from_secs(24 * 3600);

/// How far past the redelivery horizon an `auto` keep reaches at least.
const AUTO_MARGIN: Duration = Duration::from_secs(3600);

/// The `retention.keep` this process purges with. A duration is checked
/// against the longest replay of every source topic (see `Replay`:
/// retention.ms + segment.ms + the broker's check; forever for a compacted
/// topic or `retention.ms = -1`) and refused if shorter, unless
/// `retention.allow_shorter_than_topics` says the operator accepts it.
/// `auto` becomes that longest replay, never less than a day nor less than
/// an hour past the redelivery horizon.
///
/// A Kafka cluster that cannot be reached yet (restarting, or started
/// after dedupq) is waited for, not ready on `health` meanwhile; a stop
/// while waiting ends start-up cleanly ([`StoppedDuringStartUp`]).
pub async fn keep(
    settings: &Settings,
    health: &Health,
    shutdown: &CancellationToken,
) -> anyhow::Result<Duration> {
    let topics = if settings.kafka.topics.is_empty() {
        Vec::new()
    } else {
        let described = kafka::when_reachable(
            "reading the source topics' retention",
            health,
            shutdown,
            || kafka::topic_replays(&settings.kafka),
        )
        .await;
        match described {
            Ok(topics) => topics,
            Err(Gave::Stopped(e)) => {
                tracing::info!(error = %chain(&e), "stopped while waiting for Kafka");
                return Err(StoppedDuringStartUp.into());
            }
            Err(Gave::Up(e)) => return Err(e.into()),
        }
    };
    Ok(resolve(settings, &topics)?)
}

/// `keep` for these described topics.
pub fn resolve(settings: &Settings, topics: &[(String, Replay)]) -> Result<Duration, ConfigError> {
    match settings.retention.keep {
        Keep::For(keep) => check_fixed(settings, keep, topics).map(|()| keep),
        Keep::Auto => auto(settings, topics),
    }
}

fn auto(settings: &Settings, topics: &[(String, Replay)]) -> Result<Duration, ConfigError> {
    let mut keep = AUTO_FLOOR.max(settings.redelivery_horizon() + AUTO_MARGIN);
    for (topic, replay) in topics {
        let Some(longest) = replay.longest() else {
            return Err(ConfigError::new(
                "retention.keep",
                format!("\"auto\" cannot follow topic {topic}: it {replay}"),
                "set retention.keep to a duration (keys older than it are purged, so a \
                 consumer-group reset past it would charge them again) and \
                 retention.allow_shorter_than_topics = true, or give the topic a retention.ms",
            ));
        };
        keep = keep.max(longest);
    }
    Ok(keep)
}

fn check_fixed(
    settings: &Settings,
    keep: Duration,
    topics: &[(String, Replay)],
) -> Result<(), ConfigError> {
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
        "remove retention.keep (\"auto\" follows the topics), keep keys at least as long as \
         the topics can replay, or lower the topics' retention.ms or segment.ms (a compacted \
         topic replays forever); set retention.allow_shorter_than_topics = true only if no \
         consumer group can ever replay past the kept keys",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::kafka::CheckInterval;
    use std::collections::HashMap;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn stock() -> (String, Replay) {
        let configs = HashMap::new();
        let replay = Replay::from_configs(&configs, CheckInterval::KAFKA_DEFAULT);
        ("payments".into(), replay)
    }

    fn compacted() -> (String, Replay) {
        let configs = HashMap::from([("cleanup.policy", "compact")]);
        let replay = Replay::from_configs(&configs, CheckInterval::KAFKA_DEFAULT);
        ("ledger".into(), replay)
    }

    #[test]
    fn auto_follows_a_stock_topic_and_is_never_below_a_day_past_the_horizon() {
        let s = Settings::default();
        let stock_replay = 14 * DAY + Duration::from_secs(300);
        assert_eq!(resolve(&s, &[stock()]).unwrap(), stock_replay);
        // Without topics (RabbitMQ, HTTP): a day, or an hour past the
        // redelivery horizon (handler.retry_for, 20 h by default).
        assert_eq!(resolve(&s, &[]).unwrap(), DAY);
        let mut long = Settings::default();
        long.retention.redelivery_horizon = 3 * DAY;
        assert_eq!(resolve(&long, &[]).unwrap(), 3 * DAY + AUTO_MARGIN);
    }

    #[test]
    fn auto_refuses_a_topic_that_replays_forever_and_names_the_setting() {
        let err = resolve(&Settings::default(), &[stock(), compacted()]).unwrap_err();
        assert_eq!(err.setting, "retention.keep");
        assert!(err.to_string().contains("ledger"), "{err}");
    }

    #[test]
    fn a_fixed_keep_shorter_than_a_topic_is_refused_unless_allowed() {
        let mut s = Settings::default();
        s.retention.keep = Keep::For(DAY);
        let err = resolve(&s, &[stock()]).unwrap_err();
        assert!(err.to_string().contains("payments"), "{err}");
        s.retention.allow_shorter_than_topics = true;
        assert_eq!(resolve(&s, &[stock()]).unwrap(), DAY);
        s.retention.keep = Keep::For(15 * DAY);
        s.retention.allow_shorter_than_topics = false;
        assert_eq!(resolve(&s, &[stock()]).unwrap(), 15 * DAY);
    }
}
