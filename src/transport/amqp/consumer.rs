//! One work queue: consume with manual acks, batch the prefetch window,
//! let the engine decide, apply the decisions.

use super::apply::Applier;
use super::batch::{next_batch, Next};
use super::config::AmqpSettings;
use super::delivery::receive;
use super::error::AmqpError;
use super::publish::Publisher;
use crate::engine::{Decision, Engine, Incoming};
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub(super) struct Worker {
    queue: String,
    settings: Arc<AmqpSettings>,
    engine: Engine,
    publisher: Publisher,
    // Kept so the consuming channel lives as long as the worker.
    _channel: Channel,
    consumer: Consumer,
}

impl Worker {
    /// Opens the worker's channels and starts consuming.
    pub(super) async fn start(
        connection: &Connection,
        queue: &str,
        settings: Arc<AmqpSettings>,
        engine: Engine,
    ) -> Result<Self, AmqpError> {
        let publisher = Publisher::open(connection).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::channel("channel.open"))?;
        // Per consumer: the window one batch is collected from.
        channel
            .basic_qos(settings.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(AmqpError::channel("basic.qos"))?;
        let options = BasicConsumeOptions {
            // Ignored by RabbitMQ.
            no_local: false,
            // Manual acks: a delivery is acked only after its outcome is durable.
            no_ack: false,
            // Competing consumers: other dedupq instances share the queue.
            exclusive: false,
            nowait: false,
        };
        // Empty tag: the broker picks a unique one.
        let consumer = channel
            .basic_consume(queue.into(), "".into(), options, FieldTable::default())
            .await
            .map_err(AmqpError::channel("basic.consume"))?;
        Ok(Self {
            queue: queue.to_string(),
            settings,
            engine,
            publisher,
            _channel: channel,
            consumer,
        })
    }

    /// Runs until `stop` (after finishing the batch in hand) or until the
    /// channel fails.
    pub(super) async fn run(mut self, stop: CancellationToken) -> Result<(), AmqpError> {
        let max = usize::from(self.settings.prefetch);
        loop {
            let deliveries = match next_batch(
                &mut self.consumer,
                max,
                self.settings.batch_linger,
                &stop,
            )
            .await
            {
                Next::Batch(d) => d,
                Next::Stopped => return Ok(()),
                Next::Ended(source) => {
                    return Err(AmqpError::ConsumerEnded {
                        queue: self.queue.clone(),
                        source,
                    })
                }
            };
            let (batch, metas): (Vec<_>, Vec<_>) = deliveries
                .into_iter()
                .map(|d| receive(&self.queue, d))
                .unzip();
            let redelivered = metas.iter().filter(|m| m.redelivered).count();
            tracing::debug!(queue = %self.queue, size = batch.len(), redelivered, "batch");
            let Some(decisions) = self.decide(&batch, &stop).await else {
                // Stopping during a store outage: nothing is acked; the
                // broker redelivers the batch to whoever consumes next.
                return Ok(());
            };
            let applier = Applier {
                settings: &self.settings,
                queue: &self.queue,
                publisher: &self.publisher,
                metrics: self.engine.metrics(),
            };
            applier.apply(batch, metas, decisions).await?;
        }
    }

    /// The engine's decisions, retrying the whole batch while PostgreSQL is
    /// unreachable. The deliveries stay unacked meanwhile, so the full
    /// prefetch window also stops the broker from pushing more.
    async fn decide(&self, batch: &[Incoming], stop: &CancellationToken) -> Option<Vec<Decision>> {
        let backoff = self.engine.options().backoff;
        let mut attempt = 1;
        loop {
            match self.engine.process(batch).await {
                Ok(decisions) => return Some(decisions),
                Err(e) => {
                    let wait = backoff.after_attempt(attempt);
                    tracing::warn!(queue = %self.queue, error = %e, attempt, ?wait, "store unavailable; batch kept unacked");
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    attempt += 1;
                }
            }
        }
    }
}
