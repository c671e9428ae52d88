//! Kafka consumer-group member.

mod config;

pub use config::KafkaSettings;

use crate::engine::Engine;
use crate::health::Health;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("creating the Kafka client failed")]
    Client(#[source] rdkafka::error::KafkaError),
}

/// Consumes the configured topics until `shutdown`.
pub async fn run(
    settings: KafkaSettings,
    engine: Engine,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let _ = (settings, engine, health);
    shutdown.cancelled().await;
    Ok(())
}
