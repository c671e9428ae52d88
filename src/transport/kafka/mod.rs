//! Kafka consumer-group member. Offsets advance only over a contiguous
//! prefix of messages whose outcome is durable (stored, or dead letter
//! confirmed); see DESIGN.md section 3.

mod admin;
mod apply;
mod consumer;
mod context;
mod dead_letter;
mod error;
mod lanes;
mod ledger;
mod message;
mod offsets;
mod outbox;
mod queue;
mod reload;
mod replay;
mod reply;

pub use crate::config::KafkaSettings;
pub(crate) use admin::when_reachable;
pub use admin::{cluster, produced_topics, topic_replays, Cluster};
pub use error::{KafkaError, ProduceError};
pub use reload::run_reloading;
pub use replay::{CheckInterval, Replay};

use crate::backoff::Gave;
use crate::broker::{self, kafka::Producing};
use crate::engine::Pipeline;
use crate::health::Health;
use crate::message::Transport;
use apply::BatchContext;
use consumer::{Ended, KafkaConsumer, Pump};
use context::Context;
use ledger::Ledger;
use outbox::Outbox;
use rdkafka::consumer::Consumer;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Consumes the configured topics until `shutdown`, then lets in-flight
/// work finish (bounded by `drain_timeout`) and commits what is durable.
/// A consumer that reaches no broker for `kafka.restart_after_down` is
/// rebuilt with a new client.
pub async fn run(
    settings: KafkaSettings,
    pipeline: Arc<dyn Pipeline>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    settings.validate().map_err(KafkaError::Settings)?;
    loop {
        let ended = consume(&settings, pipeline.clone(), &health, &shutdown).await?;
        if ended == Ended::Stopped || shutdown.is_cancelled() {
            return Ok(());
        }
        pipeline.metrics().kafka_client_restarts.inc();
    }
}

/// One client's life: the start-up checks, then the consumer until it
/// stops or reaches no broker for too long.
async fn consume(
    settings: &KafkaSettings,
    pipeline: Arc<dyn Pipeline>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Ended, KafkaError> {
    let topics_exist = admin::when_reachable(
        "checking the dead-letter and reply topics",
        health,
        shutdown,
        || admin::ensure_produced_topics(settings),
    )
    .await;
    match topics_exist {
        Ok(()) => {}
        Err(Gave::Stopped(_)) => return Ok(Ended::Stopped),
        Err(Gave::Up(e)) => return Err(e),
    }
    let ledger = Arc::new(Ledger::default());
    let metrics = pipeline.metrics().clone();
    let context = Context {
        ledger: ledger.clone(),
        health: health.clone(),
        metrics: metrics.clone(),
        drain_timeout: settings.drain_timeout,
    };
    // Not ready until the group assigns partitions or a broker reports up.
    context.set_up(false);
    let consumer: KafkaConsumer = broker::kafka::consumer(settings)
        .create_with_context(context)
        .map_err(KafkaError::Client)?;
    let consumer = Arc::new(consumer);
    let producer =
        broker::kafka::Renewing::new(broker::kafka::producer(settings, Producing::Outbox))
            .map_err(KafkaError::Client)?;
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(KafkaError::Subscribe)?;
    tracing::info!(topics = ?settings.topics, group = %settings.group_id, "kafka consumer subscribed");
    let dead_letters_failed = metrics
        .dead_letters_failed
        .with_label_values(&[Transport::Kafka.label()]);
    let shared = Arc::new(BatchContext {
        metrics,
        pipeline,
        outbox: Outbox {
            producer,
            queue_timeout: settings.produce_timeout,
            dead_letters_failed,
            // Cancelled by the drain when its bound is over, not at once:
            // dead letters in flight at shutdown still get confirmed.
            shutdown: CancellationToken::new(),
        },
        ledger: ledger.clone(),
        dlq_suffix: settings.dlq_suffix.clone(),
        dead_letter_max_bytes: settings.dead_letter_max_bytes,
        reply_topic: settings.reply_topic.clone(),
    });
    let result = Pump::new(
        consumer.clone(),
        shared,
        ledger,
        settings.clone(),
        health.clone(),
    )
    .run(shutdown.clone())
    .await;
    // Leaving the group runs the revoke callback and blocks while it polls;
    // keep that off the async workers. A client cut off from its brokers
    // may not manage to leave: the new one does not wait for it longer
    // than a drain.
    let closing = tokio::task::spawn_blocking(move || drop(consumer));
    match result {
        Ok(Ended::Unreachable) => {
            if tokio::time::timeout(settings.drain_timeout, closing)
                .await
                .is_err()
            {
                tracing::warn!(
                    "the old Kafka client is still closing; the new one starts beside it"
                );
            }
        }
        _ => {
            let _ = closing.await;
        }
    }
    result
}
