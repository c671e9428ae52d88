//! Opening a lapin connection, for every lapin client of dedupq. There is
//! no lapin auto-recovery: whoever loses a connection drops it with its
//! channels and connects again, so a delivery from an old channel can never
//! be mistaken for a live one.

use crate::config::{AmqpSettings, ConfigError};
use lapin::tcp::OwnedTLSConfig;
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, DefaultConnectionBuilder};
use std::time::Duration;

/// Why no connection was opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `amqp.url` is not an AMQP URL, or `amqp.tls_ca_file` is unusable:
    /// no retry helps.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Refused, TLS, credentials: the broker or the way to it.
    #[error("connecting to RabbitMQ at {url} failed")]
    Failed {
        /// Redacted (no password).
        url: String,
        /// What lapin said.
        #[source]
        source: lapin::Error,
    },
    /// TCP connect, TLS and AMQP handshakes took longer than
    /// `amqp.connect_timeout`.
    #[error("connecting to RabbitMQ at {url} timed out after {after:?}")]
    Timeout {
        /// Redacted (no password).
        url: String,
        /// `amqp.connect_timeout`.
        after: Duration,
    },
}

/// `amqp.url` parsed; the error names the setting without the password.
pub(super) fn uri(settings: &AmqpSettings) -> Result<AMQPUri, ConfigError> {
    settings.url.expose().parse().map_err(|_| {
        ConfigError::new(
            "amqp.url",
            format!("'{}' is not an AMQP URL", settings.url),
            "use amqp://user:password@host:5672/vhost or amqps://… for TLS",
        )
    })
}

/// Connects to `amqp.url` as `name` (shown in the management UI), trusting
/// `amqp.tls_ca_file` for `amqps://` besides the system's roots, proposing
/// `amqp.heartbeat`, and bounded by `amqp.connect_timeout`.
pub async fn connect(settings: &AmqpSettings, name: &str) -> Result<Connection, ConnectError> {
    let url = settings.url.to_string();
    let mut uri = uri(settings)?;
    // Settings fill in what the URL leaves open; a value in the URL wins.
    let query = &mut uri.query;
    query
        .heartbeat
        .get_or_insert(settings.heartbeat.as_secs() as u16);
    query
        .connection_timeout
        .get_or_insert(settings.connect_timeout.as_millis() as u64);
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    // Read at every connect, so a rotated CA file takes effect on reconnect.
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: settings.tls_ca_pem()?,
    };
    let builder = DefaultConnectionBuilder::new()
        .map_err(|source| ConnectError::Failed {
            url: url.clone(),
            source,
        })?
        .with_uri(uri)
        .with_properties(properties)
        .with_tls_config(tls);
    // lapin's own timeout covers the TCP connect; this one also bounds the
    // TLS and AMQP handshakes.
    let after = settings.connect_timeout;
    match tokio::time::timeout(after, builder.connect()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(ConnectError::Failed { url, source }),
        Err(_) => Err(ConnectError::Timeout { url, after }),
    }
}
