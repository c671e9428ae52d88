//! Opening the connection. There is no lapin auto-recovery: on any loss
//! the runner drops the connection with its channels and consumers and
//! builds new ones, so a delivery from an old channel can never be mistaken
//! for a live one (its ack returns `Ok(false)`, which we treat as not done).

use super::error::AmqpError;
use crate::config::AmqpSettings;
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};

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
    // lapin's own timeout covers the TCP connect; this one also bounds the
    // TLS and AMQP handshakes.
    match tokio::time::timeout(
        settings.connect_timeout,
        Connection::connect_uri(uri, properties),
    )
    .await
    {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(AmqpError::Connect {
            url: redacted,
            source,
        }),
        Err(_) => Err(AmqpError::ConnectTimeout { url: redacted }),
    }
}
