//! Kafka consumer-group member. Offsets advance only over a contiguous
//! prefix of messages whose outcome is durable (stored, or dead letter
//! confirmed); see DESIGN.md section 3.

mod batch;
mod client;

mod consumer;
mod context;
mod dead_letter;
mod error;
mod lanes;
mod ledger;
mod message;
mod offsets;
mod outbox;
mod reply;

pub use crate::config::KafkaSettings;
pub use dead_letter::header as dead_letter_header;
pub use error::{KafkaError, ProduceError};
pub use reply::header as reply_header;

use crate::engine::Engine;
use crate::health::Health;
use batch::Shared;
use consumer::{KafkaConsumer, Pump};
use context::Context;
use ledger::Ledger;
use outbox::Outbox;
use rdkafka::consumer::Consumer;
use rdkafka::producer::FutureProducer;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Consumes the configured topics until `shutdown`, then lets in-flight
/// work finish (bounded by `drain_timeout`) and commits what is durable.
pub async fn run(
    settings: KafkaSettings,
    engine: Engine,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    client::validate(&settings)?;
    let ledger = Arc::new(Ledger::default());
    let context = Context {
        ledger: ledger.clone(),
        health,
        metrics: engine.metrics().clone(),
        drain_timeout: settings.drain_timeout,
    };
    // Not ready until the group assigns partitions or a broker reports up.
    context.set_up(false);
    let consumer: KafkaConsumer = client::consumer_config(&settings)
        .create_with_context(context)
        .map_err(KafkaError::Client)?;
    let consumer = Arc::new(consumer);
    let producer: FutureProducer = client::producer_config(&settings)
        .create()
        .map_err(KafkaError::Client)?;
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(KafkaError::Subscribe)?;
    tracing::info!(topics = ?settings.topics, group = %settings.group_id, "kafka consumer subscribed");
    let shared = Arc::new(Shared {
        metrics: engine.metrics().clone(),
        engine,
        outbox: Outbox {
            producer,
            queue_timeout: settings.produce_timeout,
            // Cancelled by the drain when its bound is over, not at once:
            // dead letters in flight at shutdown still get confirmed.
            shutdown: CancellationToken::new(),
        },
        ledger: ledger.clone(),
        dlq_suffix: settings.dlq_suffix.clone(),
        reply_topic: settings.reply_topic.clone(),
    });
    let result = Pump::new(consumer.clone(), shared, ledger, settings)
        .run(shutdown)
        .await;
    // Leaving the group runs the revoke callback and blocks while it polls;
    // keep that off the async workers.
    let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
    result
}
