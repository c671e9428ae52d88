//! RabbitMQ settings (`[amqp]`) and their start-up checks.

use crate::config::{ConfigError, SecretUrl};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Longest queue or exchange name RabbitMQ accepts (an AMQP short string).
const MAX_NAME: usize = 255;

/// Whether dedupq creates its RabbitMQ objects or only checks they exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// Declare (idempotently) the work, delay and dead-letter queues and the
    /// dead-letter exchange on every connect.
    Declare,
    /// Only check that they exist (passive declares); for brokers whose
    /// topology is owned by someone else. Bindings cannot be checked this
    /// way; unroutable dead letters or retries are caught by mandatory
    /// publishing instead.
    Verify,
}

/// The RabbitMQ queue type of every queue dedupq declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueType {
    /// Single-node queues: not replicated, and without a delivery limit, so
    /// a message that breaks the connection needs an operator.
    Classic,
    /// Replicated (Raft); the safe choice for payments. Needs RabbitMQ 3.10+
    /// for per-message TTL in the delay queue.
    Quorum,
}

impl QueueType {
    /// The type as RabbitMQ names it (the `x-queue-type` argument).
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

/// `[amqp]`: the RabbitMQ transport, off while `amqp.queues` is empty.
/// Checked at start-up only when it is on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSettings {
    /// Work queues to consume; empty: the RabbitMQ transport is off.
    pub queues: Vec<String>,
    /// `amqp://` or `amqps://` (TLS) URL with credentials; set it through
    /// `DEDUPQ__AMQP__URL` to keep the password out of files. Never logged.
    pub url: SecretUrl,
    /// A file holding the URL (a Kubernetes or Docker secret); wins over
    /// `url`.
    pub url_file: Option<PathBuf>,
    /// PEM file of the CA that signed the broker's certificate, for
    /// `amqps://` with a private CA (trusted besides the system's roots).
    pub tls_ca_file: Option<PathBuf>,
    /// Unacked deliveries the broker may push per queue at once; claims are
    /// batched over this window. At least 1 (0 would mean "unbounded").
    pub prefetch: u16,
    /// Declare the topology, or only verify that it exists.
    pub topology: Topology,
    /// Type of the queues dedupq declares (work, delay, dead-letter).
    pub queue_type: QueueType,
    /// Topic exchange that receives dead letters, routed by the work queue
    /// name.
    pub dead_letter_exchange: String,
    /// Queue bound to the dead-letter exchange with `#` (every work queue).
    pub dead_letter_queue: String,
    /// The delay queue of work queue `q` is `q` + this suffix. Messages wait
    /// there with a per-message TTL, then dead-letter back to `q`.
    pub delay_queue_suffix: String,
    /// Trips through the delay queue before a message is dead-lettered with
    /// reason `retry_limit` (no endless redelivery).
    pub max_redeliveries: u32,
    /// Shortest delay-queue wait; doubles with every trip.
    #[serde(with = "humantime_serde")]
    pub retry_delay_min: Duration,
    /// Longest delay-queue wait.
    #[serde(with = "humantime_serde")]
    pub retry_delay_max: Duration,
    /// After the first delivery of a batch, how long to wait for more before
    /// claiming (the batch never exceeds `prefetch`).
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Batches of one queue processed at once. More than one, so that a
    /// slow handler does not hold up the rest of the queue; acks are per
    /// delivery, so batches may finish in any order.
    pub max_batches_in_flight: usize,
    /// First wait before reconnecting after a lost connection; doubles up to
    /// `reconnect_backoff_max`.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_min: Duration,
    /// `amqp.reconnect_backoff_max` (default 10s): the longest wait between
    /// two reconnect attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
    /// Heartbeat interval proposed to the broker (a `heartbeat=` in the URL
    /// wins); a dead peer is noticed after about twice this.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Limit on TCP connect + TLS + AMQP handshake.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Shown in the management UI and `rabbitmqctl list_connections`.
    pub connection_name: String,
    /// Deliveries of one message before RabbitMQ itself dead-letters it
    /// (quorum queues' `x-delivery-limit`, with the dead-letter exchange on
    /// the work queue). This bounds what dedupq cannot even read: a message
    /// whose properties or header names are not UTF-8 breaks the client's
    /// connection before any code of dedupq sees it, and comes back after
    /// every reconnect. Every connection loss and crash with the message
    /// unacked counts one delivery, so keep it well above the losses one
    /// healthy message may see.
    pub delivery_limit: u32,
    /// After a session ends with an error, the next one consumes with a
    /// prefetch of 1 until this many deliveries were acked, so a message
    /// that breaks the connection is alone in flight and only its own
    /// delivery count grows.
    pub cautious_acks: u32,
    /// On shutdown, how long batches in hand may take to finish before the
    /// connection is closed (their deliveries then come back).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// A queue with unacked deliveries and no ack for this long, or whose
    /// sessions keep failing for this long, is reported stalled.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            url: SecretUrl::new("amqp://guest:guest@127.0.0.1:5672/%2f"),
            url_file: None,
            tls_ca_file: None,
            prefetch: 256,
            topology: Topology::Declare,
            queue_type: QueueType::Quorum,
            dead_letter_exchange: "dedupq.dlx".into(),
            dead_letter_queue: "dedupq.dlq".into(),
            delay_queue_suffix: ".delay".into(),
            max_redeliveries: 20,
            retry_delay_min: Duration::from_millis(250),
            retry_delay_max: Duration::from_secs(60),
            batch_linger: Duration::from_millis(5),
            max_batches_in_flight: 4,
            reconnect_backoff_min: Duration::from_millis(200),
            reconnect_backoff_max: Duration::from_secs(10),
            heartbeat: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            connection_name: "dedupq".into(),
            delivery_limit: 20,
            cautious_acks: 256,
            drain_timeout: Duration::from_secs(15),
            stall_after: Duration::from_secs(60),
        }
    }
}

impl AmqpSettings {
    /// The defaults, reaching `url`: a client of the lab or the tests.
    pub fn at(url: &str) -> Self {
        Self {
            url: SecretUrl::new(url),
            ..Self::default()
        }
    }

    /// The delay queue of work queue `queue`: its name followed by
    /// `amqp.delay_queue_suffix`.
    pub fn delay_queue(&self, queue: &str) -> String {
        format!("{queue}{}", self.delay_queue_suffix)
    }

    /// The wait in the delay queue before trip `attempt` (1-based): the
    /// engine's suggestion, but at least the doubling minimum.
    pub fn retry_delay(&self, attempt: u32, suggested: Duration) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let escalated = self.retry_delay_min.saturating_mul(1 << exp);
        suggested.max(escalated).min(self.retry_delay_max)
    }

    /// The longest a message can spend travelling through delay queues; the
    /// key retention must outlast it.
    pub fn redelivery_span(&self) -> Duration {
        self.retry_delay_max.saturating_mul(self.max_redeliveries)
    }

    /// The shortest time a message can spend travelling through the delay
    /// queue before `max_redeliveries` dead-letters it: every trip waits
    /// its floor (the doubling minimum, capped). A message whose key a dead
    /// worker holds must still be travelling when that lease ends, or it
    /// is dead-lettered instead of taken over (see `config::check`).
    pub fn least_redelivery_span(&self) -> Duration {
        let (mut span, mut last) = (Duration::ZERO, None);
        for trip in 1..=self.max_redeliveries {
            let wait = self.retry_delay(trip, Duration::ZERO);
            // Once the waits stop growing (the cap, or the doubling's end),
            // every trip left waits the same.
            if last == Some(wait) {
                let left = self.max_redeliveries - trip + 1;
                return span.saturating_add(wait.saturating_mul(left));
            }
            span = span.saturating_add(wait);
            last = Some(wait);
        }
        span
    }

    /// Start-up checks; each error names the setting and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.expose();
        if !(url.starts_with("amqp://") || url.starts_with("amqps://"))
            || url.parse::<lapin::uri::AMQPUri>().is_err()
        {
            return Err(ConfigError::new(
                "amqp.url",
                format!("'{}' is not an AMQP URL", self.url),
                "use amqp://user:password@host:5672/vhost or amqps://… for TLS",
            ));
        }
        if self.delivery_limit < 2 {
            return Err(ConfigError::new(
                "amqp.delivery_limit",
                format!(
                    "{} leaves no room for a single connection loss",
                    self.delivery_limit
                ),
                "use at least 5; the default is 20",
            ));
        }
        self.check_tls_ca()?;
        if self.prefetch == 0 {
            return Err(ConfigError::new(
                "amqp.prefetch",
                "0 means unbounded: every message of the queue would be held in memory",
                "set it to the batch size you want, e.g. 256",
            ));
        }
        self.check_names()?;
        if self.max_batches_in_flight == 0 {
            return Err(ConfigError::new(
                "amqp.max_batches_in_flight",
                "must be at least 1",
                "the default is 4",
            ));
        }
        if self.max_redeliveries == 0 {
            return Err(ConfigError::new(
                "amqp.max_redeliveries",
                "must be at least 1",
                "the default is 20",
            ));
        }
        check_range(
            "amqp.retry_delay_min",
            self.retry_delay_min,
            self.retry_delay_max,
        )?;
        check_range(
            "amqp.reconnect_backoff_min",
            self.reconnect_backoff_min,
            self.reconnect_backoff_max,
        )?;
        if self.heartbeat.as_secs() > u64::from(u16::MAX) {
            return Err(ConfigError::new(
                "amqp.heartbeat",
                "is longer than the protocol allows (65535 s)",
                "use a few seconds, e.g. 10s",
            ));
        }
        Ok(())
    }

    /// The CA file exists and holds at least one PEM certificate, so a bad
    /// path stops start-up instead of every reconnect.
    fn check_tls_ca(&self) -> Result<(), ConfigError> {
        self.tls_ca_pem().map(|_| ())
    }

    /// The PEM text of `amqp.tls_ca_file`, if set.
    pub(crate) fn tls_ca_pem(&self) -> Result<Option<String>, ConfigError> {
        self.tls_ca_file
            .as_deref()
            .map(|path| super::read_ca_pem("amqp.tls_ca_file", path, "the broker's"))
            .transpose()
    }

    fn check_names(&self) -> Result<(), ConfigError> {
        let fixed = [
            ("amqp.dead_letter_exchange", &self.dead_letter_exchange),
            ("amqp.dead_letter_queue", &self.dead_letter_queue),
            ("amqp.delay_queue_suffix", &self.delay_queue_suffix),
        ];
        for (setting, name) in fixed {
            if name.is_empty() || name.len() > MAX_NAME {
                return Err(ConfigError::new(
                    setting,
                    "must be 1..=255 bytes",
                    "name it, e.g. the default",
                ));
            }
        }
        for queue in &self.queues {
            let delay = self.delay_queue(queue);
            if queue.is_empty() || delay.len() > MAX_NAME {
                return Err(ConfigError::new(
                    "amqp.queues",
                    format!("'{queue}' is empty or too long with its delay suffix"),
                    "use queue names of 1..=255 bytes including amqp.delay_queue_suffix",
                ));
            }
            if self.queues.contains(&delay) || *queue == self.dead_letter_queue {
                return Err(ConfigError::new(
                    "amqp.queues",
                    format!("'{queue}' collides with a delay or dead-letter queue name"),
                    "consume only work queues",
                ));
            }
        }
        Ok(())
    }
}

fn check_range(setting: &str, min: Duration, max: Duration) -> Result<(), ConfigError> {
    if min.is_zero() || min > max {
        return Err(ConfigError::new(
            setting,
            format!("{min:?} must be positive and at most the matching _max ({max:?})"),
            "make the minimum positive and not larger than the maximum",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_escalates_with_the_trip_count_and_is_capped() {
        let s = AmqpSettings::default();
        let d = |n| s.retry_delay(n, Duration::from_millis(10));
        assert_eq!(d(1), Duration::from_millis(250));
        assert_eq!(d(3), Duration::from_millis(1000));
        assert_eq!(d(40), Duration::from_secs(60));
        assert_eq!(
            s.retry_delay(1, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn the_least_redelivery_span_adds_every_trip_at_its_floor() {
        let s = AmqpSettings::default();
        // 250 ms doubling to 32 s (8 trips, 63.75 s), then 12 trips of 60 s.
        assert_eq!(s.least_redelivery_span(), Duration::from_millis(783_750));
        let s = AmqpSettings {
            max_redeliveries: 3,
            ..AmqpSettings::default()
        };
        assert_eq!(s.least_redelivery_span(), Duration::from_millis(1_750));
        let s = AmqpSettings {
            max_redeliveries: u32::MAX,
            retry_delay_min: Duration::from_nanos(1),
            retry_delay_max: Duration::from_secs(3600),
            ..AmqpSettings::default()
        };
        // The doubling ends at 2^20 ns: ~1 ms a trip from then on, ~52 days.
        assert!(s.least_redelivery_span() > Duration::from_secs(3600 * 24 * 50));
    }

    #[test]
    fn a_zero_prefetch_and_a_non_amqp_url_are_refused() {
        let s = AmqpSettings {
            prefetch: 0,
            ..AmqpSettings::default()
        };
        assert_eq!(s.validate().unwrap_err().setting, "amqp.prefetch");
        let s = AmqpSettings {
            url: SecretUrl::new("http://user:secret@host/"),
            ..AmqpSettings::default()
        };
        let e = s.validate().unwrap_err();
        assert_eq!(e.setting, "amqp.url");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn a_work_queue_named_like_another_queues_delay_queue_is_refused() {
        let s = AmqpSettings {
            queues: vec!["pay".into(), "pay.delay".into()],
            ..AmqpSettings::default()
        };
        assert_eq!(s.validate().unwrap_err().setting, "amqp.queues");
    }
}
