use crate::broker::amqp::{ConnectError, PublishError};
use crate::config::ConfigError;

/// What can stop a RabbitMQ session. The variant decides: `Config` stops
/// dedupq; everything else ends the session, and the runner reconnects with
/// backoff (unacked deliveries come back and are claimed again).
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// An `[amqp]` setting is unusable (not an AMQP URL, an unreadable
    /// `amqp.tls_ca_file`, a value out of range). Stops dedupq.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The connection could not be opened (refused, TLS, credentials).
    #[error("connecting to RabbitMQ at {url} failed")]
    Connect {
        /// Redacted (no password).
        url: String,
        /// What the client library said.
        #[source]
        source: lapin::Error,
    },
    /// Connecting, including the TLS and AMQP handshakes, took longer than
    /// `amqp.connect_timeout`.
    #[error("connecting to RabbitMQ at {url} timed out")]
    ConnectTimeout {
        /// Redacted (no password).
        url: String,
    },
    /// An AMQP method failed (opening a channel, qos, consume, publish,
    /// ack, a publisher confirm).
    #[error("RabbitMQ operation `{op}` failed")]
    Channel {
        /// The AMQP method, such as `basic.ack`.
        op: &'static str,
        /// What the client library said.
        #[source]
        source: lapin::Error,
    },
    /// A queue, exchange or binding is missing or declared with other
    /// arguments than dedupq needs.
    #[error("RabbitMQ topology: {what}")]
    Topology {
        /// Which object, and how to fix it.
        what: String,
        /// What the broker said.
        #[source]
        source: lapin::Error,
    },
    /// A publish was not confirmed (nacked, returned as unroutable, or a
    /// name too long for AMQP). For a dead letter or delay-queue copy the
    /// delivery it stood for stays unacked; a reply is only counted.
    #[error("publish to {destination} was not confirmed: {why}")]
    Unconfirmed {
        /// The exchange and routing key.
        destination: String,
        /// Why the broker did not take it.
        why: String,
    },
    /// The ack went nowhere because its channel had closed; the delivery
    /// comes back and is claimed again (a duplicate by then).
    #[error("delivery {delivery_tag} of {queue} could not be acked: its channel is gone")]
    StaleAck {
        /// The queue the delivery came from.
        queue: String,
        /// The delivery's tag on its (closed) channel.
        delivery_tag: u64,
    },
    /// The broker stopped the queue's consumer (queue deleted, channel
    /// closed, or a delivery the client library could not parse).
    #[error("the consumer of {queue} ended")]
    ConsumerEnded {
        /// The queue whose consumer ended.
        queue: String,
        /// The client library's error, when it gave one.
        #[source]
        source: Option<lapin::Error>,
    },
    /// A queue worker or batch task panicked or was cancelled.
    #[error("a consumer task stopped abnormally: {0}")]
    Task(String),
    /// The connection reported an error (heartbeat missed, broker closed
    /// it).
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

impl From<ConnectError> for AmqpError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Config(e) => AmqpError::Config(e),
            ConnectError::Failed { url, source } => AmqpError::Connect { url, source },
            ConnectError::Timeout { url, .. } => AmqpError::ConnectTimeout { url },
        }
    }
}

impl From<PublishError> for AmqpError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Channel { op, source } => AmqpError::Channel { op, source },
            PublishError::Unconfirmed { destination, why } => {
                AmqpError::Unconfirmed { destination, why }
            }
        }
    }
}
