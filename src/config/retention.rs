//! `[retention]`: how long finished keys are kept, and how they are purged.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// `[retention]`: how long finished keys are kept, and how they are purged.
/// `in_progress` and `unknown` keys are never purged.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Finished keys are kept this long, then purged; `"auto"` (the
    /// default) keeps them as long as the consumed topics can replay.
    pub keep: Keep,
    /// The longest a message may be redelivered after its first delivery
    /// (consumer lag you tolerate, delay queues, producer retries).
    #[serde(with = "humantime_serde")]
    pub redelivery_horizon: Duration,
    /// `retention.purge_every` (default 1m): how often the upkeep leader
    /// purges finished keys older than `keep`.
    #[serde(with = "humantime_serde")]
    pub purge_every: Duration,
    /// `retention.purge_batch` (default 1000): most keys one purge statement
    /// deletes; a purge repeats statements until fewer are left.
    pub purge_batch: i64,
    /// Accept a `keep` shorter than a source topic can replay (by
    /// default start-up refuses it: a group reset would replay purged keys).
    pub allow_shorter_than_topics: bool,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            keep: Keep::Auto,
            redelivery_horizon: Duration::from_secs(6 * 3600),
            purge_every: Duration::from_secs(60),
            purge_batch: 1000,
            allow_shorter_than_topics: false,
        }
    }
}

/// `retention.keep`: a duration (`"14d"`), or `"auto"`.
///
/// `auto` is resolved at start-up (see `dedupq::retention::keep`): the
/// longest replay of the consumed Kafka topics (`retention.ms` +
/// `segment.ms` + the broker's check interval; 14 days and 5 minutes on a
/// stock broker), and never less than a day, nor less than an hour past the
/// redelivery horizon. A topic that replays forever (compacted, or
/// `retention.ms = -1`) has no such bound: start-up then asks for a
/// duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    /// Follow what the consumed topics can replay.
    #[default]
    Auto,
    /// This long, whatever the topics keep (start-up still refuses one
    /// shorter than a topic's replay unless `allow_shorter_than_topics`).
    For(Duration),
}

impl Keep {
    /// The duration set, or `None` for `auto`.
    pub fn fixed(self) -> Option<Duration> {
        match self {
            Keep::Auto => None,
            Keep::For(d) => Some(d),
        }
    }
}

impl From<Duration> for Keep {
    fn from(d: Duration) -> Self {
        Keep::For(d)
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::Auto => f.write_str("auto"),
            Keep::For(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

impl Serialize for Keep {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(Keep::Auto);
        }
        humantime::parse_duration(text.trim())
            .map(Keep::For)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "\"{text}\" is neither \"auto\" nor a duration such as \"14d\": {e}"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct Wrap {
        keep: Keep,
    }

    #[test]
    fn keep_reads_auto_or_a_duration_and_writes_what_it_read() {
        let auto: Wrap = toml::from_str("keep = \"auto\"").unwrap();
        assert_eq!(auto.keep, Keep::Auto);
        let week: Wrap = toml::from_str("keep = \"7d\"").unwrap();
        assert_eq!(week.keep, Keep::For(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(toml::to_string(&week).unwrap().trim(), "keep = \"7days\"");
        assert_eq!(toml::to_string(&auto).unwrap().trim(), "keep = \"auto\"");
        let bad = toml::from_str::<Wrap>("keep = \"forever\"").err().unwrap();
        assert!(bad.to_string().contains("neither \"auto\""), "{bad}");
    }
}
