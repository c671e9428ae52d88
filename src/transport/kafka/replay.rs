//! The longest a topic can replay a record, from its described configs: what
//! a consumer group reset to `earliest` reads again.
//!
//! Kafka deletes a `delete` topic a segment at a time, once the segment's
//! newest record is older than `retention.ms`. A segment takes records until
//! it rolls (`segment.ms`, or `segment.bytes` first on a busy topic), so its
//! first record stays for `retention.ms` + `segment.ms`, plus up to one
//! `log.retention.check.interval.ms` until the broker looks. Tiered storage
//! changes where records are read from, not that bound: `local.retention.ms`
//! only empties the broker's disks. Without `delete` in `cleanup.policy`
//! (compacted, or an empty policy) nothing is deleted for its age.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// Kafka's default `retention.ms` and `segment.ms` (7 days), for a config
/// the broker did not describe.
const DEFAULT_MS: i64 = 7 * 24 * 3600 * 1000;

/// How often the broker deletes expired segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckInterval {
    /// `log.retention.check.interval.ms`.
    pub every: Duration,
    /// Read from the broker; otherwise Kafka's default.
    pub from_broker: bool,
}

impl CheckInterval {
    /// Kafka's default (5 min), when the broker's cannot be read.
    pub const KAFKA_DEFAULT: Self = Self {
        every: Duration::from_secs(300),
        from_broker: false,
    };
}

/// The longest a topic keeps a record, and which configs make it so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// `cleanup.policy` without `delete`: no record is deleted for its age
    /// (a compacted topic keeps the latest record of every key).
    NotDeleted {
        /// `cleanup.policy` as described.
        policy: String,
    },
    /// `retention.ms = -1`.
    Unlimited {
        /// `cleanup.policy` as described.
        policy: String,
    },
    /// Deleted by age, a whole segment at a time.
    Bounded {
        /// `cleanup.policy` as described.
        policy: String,
        /// `retention.ms`.
        retention: Duration,
        /// `segment.ms`.
        segment: Duration,
        /// The broker's `log.retention.check.interval.ms`.
        check: CheckInterval,
        /// `local.retention.ms` of a topic on tiered storage; only named,
        /// since its records are replayed from remote storage.
        tiered_local_ms: Option<i64>,
    },
}

impl Replay {
    /// From a topic's described configs (name → value); a config missing
    /// takes Kafka's default.
    pub fn from_configs(configs: &HashMap<&str, &str>, check: CheckInterval) -> Self {
        let ms = |name: &str| configs.get(name).and_then(|v| v.trim().parse::<i64>().ok());
        let policy = configs.get("cleanup.policy").unwrap_or(&"delete").trim();
        let deletes = policy.split(',').any(|p| p.trim() == "delete");
        let policy = policy.to_string();
        if !deletes {
            return Self::NotDeleted { policy };
        }
        let retention = ms("retention.ms").unwrap_or(DEFAULT_MS);
        if retention < 0 {
            return Self::Unlimited { policy };
        }
        let tiered = configs
            .get("remote.storage.enable")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Self::Bounded {
            policy,
            retention: millis(retention),
            segment: millis(ms("segment.ms").unwrap_or(DEFAULT_MS)),
            check,
            // -2: as long as retention.ms (Kafka's default).
            tiered_local_ms: tiered.then(|| ms("local.retention.ms").unwrap_or(-2)),
        }
    }

    /// The longest a record stays replayable; `None`: forever.
    pub fn longest(&self) -> Option<Duration> {
        match self {
            Self::NotDeleted { .. } | Self::Unlimited { .. } => None,
            Self::Bounded {
                retention,
                segment,
                check,
                ..
            } => Some(*retention + *segment + check.every),
        }
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotDeleted { policy } if policy.contains("compact") => write!(
                f,
                "(cleanup.policy {policy}) is compacted: keeps the latest record of every key \
                 forever"
            ),
            Self::NotDeleted { policy } => write!(
                f,
                "(cleanup.policy \"{policy}\") deletes nothing: keeps records forever"
            ),
            Self::Unlimited { policy } => write!(
                f,
                "(cleanup.policy {policy}) keeps records forever (retention.ms -1)"
            ),
            Self::Bounded {
                policy,
                retention,
                segment,
                check,
                tiered_local_ms,
            } => {
                write!(
                    f,
                    "(cleanup.policy {policy}) keeps records up to {} (retention.ms {} + \
                     segment.ms {} + log.retention.check.interval.ms {}",
                    human(*retention + *segment + check.every),
                    human(*retention),
                    human(*segment),
                    human(check.every),
                )?;
                if !check.from_broker {
                    f.write_str(", Kafka's default: the broker's could not be read")?;
                }
                f.write_str(")")?;
                match tiered_local_ms {
                    Some(local) if *local >= 0 => write!(
                        f,
                        " from remote storage (tiered: local.retention.ms {} only empties the \
                         broker's disks)",
                        human(millis(*local))
                    ),
                    Some(_) => f.write_str(" from remote storage (tiered)"),
                    None => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);
    const BROKER: CheckInterval = CheckInterval {
        every: Duration::from_secs(60),
        from_broker: true,
    };

    fn replay(configs: &[(&str, &str)]) -> Replay {
        Replay::from_configs(&configs.iter().copied().collect(), BROKER)
    }

    #[test]
    fn a_delete_topic_replays_its_retention_plus_its_segment_roll_plus_the_check() {
        let r = replay(&[
            ("cleanup.policy", "delete"),
            ("retention.ms", "86400000"),
            ("segment.ms", "3600000"),
        ]);
        assert_eq!(r.longest(), Some(DAY + HOUR + BROKER.every));
        assert_eq!(
            r.to_string(),
            "(cleanup.policy delete) keeps records up to 1day 1h 1m (retention.ms 1day + \
             segment.ms 1h + log.retention.check.interval.ms 1m)"
        );
    }

    #[test]
    fn a_compacted_topic_replays_forever_whatever_its_retention() {
        let r = replay(&[("cleanup.policy", "compact"), ("retention.ms", "3600000")]);
        assert_eq!(r.longest(), None);
        assert!(r.to_string().contains("is compacted"), "{r}");
        assert!(r.to_string().contains("forever"), "{r}");
    }

    #[test]
    fn a_compacted_and_deleted_topic_is_bounded_like_a_delete_topic() {
        for policy in ["compact,delete", "delete, compact"] {
            let r = replay(&[
                ("cleanup.policy", policy),
                ("retention.ms", "3600000"),
                ("segment.ms", "7200000"),
            ]);
            assert_eq!(r.longest(), Some(3 * HOUR + BROKER.every), "{policy}");
        }
    }

    #[test]
    fn a_tiered_topic_is_bounded_by_its_retention_not_its_local_retention() {
        let r = replay(&[
            ("remote.storage.enable", "true"),
            ("retention.ms", "86400000"),
            ("local.retention.ms", "600000"),
            ("segment.ms", "3600000"),
        ]);
        assert_eq!(r.longest(), Some(DAY + HOUR + BROKER.every));
        let text = r.to_string();
        assert!(text.contains("from remote storage (tiered"), "{text}");
        assert!(text.contains("local.retention.ms 10m"), "{text}");
    }

    #[test]
    fn a_retention_of_minus_one_replays_forever() {
        let r = replay(&[("retention.ms", "-1"), ("segment.ms", "3600000")]);
        assert_eq!(r.longest(), None);
        assert!(r.to_string().contains("forever (retention.ms -1)"), "{r}");
    }

    #[test]
    fn an_empty_cleanup_policy_deletes_nothing() {
        assert_eq!(replay(&[("cleanup.policy", "")]).longest(), None);
    }

    #[test]
    fn missing_configs_take_kafkas_defaults() {
        let r = Replay::from_configs(&HashMap::new(), CheckInterval::KAFKA_DEFAULT);
        assert_eq!(
            r.longest(),
            Some(7 * DAY + 7 * DAY + Duration::from_secs(300))
        );
        assert!(r.to_string().contains("Kafka's default"), "{r}");
        assert!(r.to_string().contains("cleanup.policy delete"), "{r}");
    }
}
