//! Opening the connection. There is no lapin auto-recovery: on any loss
//! the runner drops the connection with its channels and consumers and
//! builds new ones, so a delivery from an old channel can never be mistaken
//! for a live one (its ack returns `Ok(false)`, which we treat as not done).

use super::error::AmqpError;
use crate::config::AmqpSettings;
use lapin::tcp::OwnedTLSConfig;
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, DefaultConnectionBuilder};

pub(super) async fn connect(settings: &AmqpSettings) -> Result<Connection, AmqpError> {
    let redacted = settings.url.to_string();
    let mut uri: AMQPUri = settings.url.expose().parse().map_err(|_| {
        AmqpError::Config(crate::config::ConfigError::new(
            "amqp.url",
            format!("'{redacted}' is not an AMQP URL"),
            "use amqp://user:password@host:5672/vhost or amqps://… for TLS",
        ))
    })?;
    // Settings fill in what the URL leaves open; a value in the URL wins.
    let query = &mut uri.query;
    query
        .heartbeat
        .get_or_insert(settings.heartbeat.as_secs() as u16);
    query
        .connection_timeout
        .get_or_insert(settings.connect_timeout.as_millis() as u64);
    let properties = ConnectionProperties::default()
        .with_connection_name(settings.connection_name.clone().into());
    let builder = DefaultConnectionBuilder::new()
        .map_err(|source| AmqpError::Connect {
            url: redacted.clone(),
            source,
        })?
        .with_uri(uri)
        .with_properties(properties)
        .with_tls_config(tls_config(settings)?);
    // lapin's own timeout covers the TCP connect; this one also bounds the
    // TLS and AMQP handshakes.
    match tokio::time::timeout(settings.connect_timeout, builder.connect()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(AmqpError::Connect {
            url: redacted,
            source,
        }),
        Err(_) => Err(AmqpError::ConnectTimeout { url: redacted }),
    }
}

/// `amqp.tls_ca_file` is trusted for `amqps://` besides the system's roots.
/// Read at every connect, so a rotated CA file takes effect on reconnect.
fn tls_config(settings: &AmqpSettings) -> Result<OwnedTLSConfig, AmqpError> {
    let cert_chain = settings.tls_ca_pem().map_err(AmqpError::Config)?;
    Ok(OwnedTLSConfig {
        identity: None,
        cert_chain,
    })
}
