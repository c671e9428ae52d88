//! What can go wrong between the raw client and the broker.

use crate::config::ConfigError;
use std::time::Duration;

/// What went wrong; the broker's own refusals have variants of their own.
#[derive(Debug, thiserror::Error)]
pub enum RawAmqpError {
    /// `amqp.url` or `amqp.tls_ca_file` is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The socket or the TLS session failed.
    #[error("socket error")]
    Io(#[from] std::io::Error),
    /// The broker said something this client does not expect.
    #[error("AMQP protocol: {0}")]
    Protocol(String),
    /// A short string (name, property) past 255 bytes.
    #[error("a short string of {0} bytes (at most 255)")]
    TooLong(usize),
    /// The broker closed the channel or the connection (e.g. 404: no such
    /// queue).
    #[error("the broker closed the {scope}: {code} {text}")]
    Closed {
        /// `connection` or `channel`.
        scope: &'static str,
        /// The AMQP reply code.
        code: u16,
        /// The broker's text.
        text: String,
    },
    /// The broker refused a publish.
    #[error("the broker refused the publish (basic.nack)")]
    Nacked,
    /// No queue took a (mandatory) publish.
    #[error("no queue took the message (basic.return {code} {text})")]
    Unroutable {
        /// The AMQP reply code (312: no route).
        code: u16,
        /// The broker's text.
        text: String,
    },
    /// The properties do not fit in one frame.
    #[error("the content header ({0} bytes) does not fit in a frame of {1} bytes")]
    HeaderTooLarge(usize, u32),
    /// Connecting took longer than `amqp.connect_timeout`.
    #[error("connecting to RabbitMQ at {url} timed out after {after:?}")]
    ConnectTimeout {
        /// Redacted (no password).
        url: String,
        /// `amqp.connect_timeout`.
        after: Duration,
    },
    /// The broker did not answer within [`ANSWER_WITHIN`](super::ANSWER_WITHIN).
    #[error("no answer from RabbitMQ within {0:?}")]
    Timeout(Duration),
}
