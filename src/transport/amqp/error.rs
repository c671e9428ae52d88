use crate::config::ConfigError;

/// What can stop a RabbitMQ session. The variant decides: `Config` stops
/// dedupq; everything else ends the session, and the runner reconnects with
/// backoff (unacked deliveries come back and are claimed again).
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("connecting to RabbitMQ at {url} failed")]
    Connect {
        /// Redacted (no password).
        url: String,
        #[source]
        source: lapin::Error,
    },
    #[error("connecting to RabbitMQ at {url} timed out")]
    ConnectTimeout { url: String },
    #[error("RabbitMQ operation `{op}` failed")]
    Channel {
        op: &'static str,
        #[source]
        source: lapin::Error,
    },
    #[error("RabbitMQ topology: {what}")]
    Topology {
        what: String,
        #[source]
        source: lapin::Error,
    },
    #[error("publish to {destination} was not confirmed: {why}")]
    Unconfirmed { destination: String, why: String },
    #[error("delivery {delivery_tag} of {queue} could not be acked: its channel is gone")]
    StaleAck { queue: String, delivery_tag: u64 },
    #[error("the consumer of {queue} ended")]
    ConsumerEnded {
        queue: String,
        #[source]
        source: Option<lapin::Error>,
    },
    #[error("a consumer task stopped abnormally: {0}")]
    Task(String),
    #[error("the RabbitMQ connection was lost")]
    ConnectionLost(#[source] lapin::Error),
}

impl AmqpError {
    /// True when reconnecting cannot help.
    pub fn is_fatal(&self) -> bool {
        matches!(self, AmqpError::Config(_))
    }

    pub(super) fn channel(op: &'static str) -> impl FnOnce(lapin::Error) -> Self {
        move |source| AmqpError::Channel { op, source }
    }
}
