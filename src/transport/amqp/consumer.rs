//! One work queue: consume with manual acks, batch the prefetch window,
//! let the engine decide, apply the decisions. Several batches may be in
//! flight, so a slow handler does not stall the queue.

use super::apply::Applier;
use super::batch::{next_batch, Next};
use super::delivery::receive;
use super::error::AmqpError;
use super::publish::Publisher;
use crate::config::AmqpSettings;
use crate::engine::{Decision, Engine, Incoming};
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub(super) struct Worker {
    shared: Arc<Shared>,
    // Kept so the consuming channel lives as long as the worker.
    _channel: Channel,
    consumer: Consumer,
}

/// What every batch task of one queue needs.
struct Shared {
    queue: String,
    settings: Arc<AmqpSettings>,
    engine: Engine,
    publisher: Publisher,
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
        // Per consumer: the window batches are collected from.
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
            shared: Arc::new(Shared {
                queue: queue.to_string(),
                settings,
                engine,
                publisher,
            }),
            _channel: channel,
            consumer,
        })
    }

    /// Runs until `stop` or until a batch or the channel fails; batches in
    /// hand are finished either way (acks on a dead channel fail harmlessly
    /// and those deliveries come back).
    pub(super) async fn run(mut self, stop: CancellationToken) -> Result<(), AmqpError> {
        let settings = self.shared.settings.clone();
        let max = usize::from(settings.prefetch);
        // Fires on `stop` or on the first failed batch.
        let halt = stop.child_token();
        let failure: Arc<Mutex<Option<AmqpError>>> = Arc::default();
        let permits = Arc::new(Semaphore::new(settings.max_batches_in_flight));
        let mut tasks = JoinSet::new();
        loop {
            // Waiting for a permit or for the first delivery takes nothing,
            // so being halted there loses nothing.
            let permit = tokio::select! {
                biased;
                _ = halt.cancelled() => break,
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let deliveries =
                match next_batch(&mut self.consumer, max, settings.batch_linger, &halt).await {
                    Next::Batch(d) => d,
                    Next::Stopped => break,
                    Next::Ended(source) => {
                        let queue = self.shared.queue.clone();
                        record(&failure, AmqpError::ConsumerEnded { queue, source });
                        break;
                    }
                };
            let (shared, halt, failure) = (self.shared.clone(), halt.clone(), failure.clone());
            tasks.spawn(async move {
                if let Err(e) = shared.handle(deliveries, &halt).await {
                    record(&failure, e);
                    halt.cancel();
                }
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                record(&failure, AmqpError::Task(e.to_string()));
            }
        }
        let first = failure.lock().unwrap_or_else(|e| e.into_inner()).take();
        first.map_or(Ok(()), Err)
    }
}

fn record(slot: &Mutex<Option<AmqpError>>, e: AmqpError) {
    slot.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(e);
}

impl Shared {
    async fn handle(
        &self,
        deliveries: Vec<Delivery>,
        halt: &CancellationToken,
    ) -> Result<(), AmqpError> {
        let (batch, metas): (Vec<_>, Vec<_>) = deliveries
            .into_iter()
            .map(|d| receive(&self.queue, self.engine.parser().key_header(), d))
            .unzip();
        let redelivered = metas.iter().filter(|m| m.redelivered).count();
        tracing::debug!(queue = %self.queue, size = batch.len(), redelivered, "batch");
        let Some(decisions) = self.decide(&batch, halt).await else {
            // Halted during a store outage: nothing is acked; the broker
            // redelivers the batch to whoever consumes next.
            return Ok(());
        };
        let applier = Applier {
            settings: &self.settings,
            queue: &self.queue,
            publisher: &self.publisher,
            metrics: self.engine.metrics(),
        };
        applier.apply(batch, metas, decisions).await
    }

    /// The engine's decisions, retrying the whole batch while PostgreSQL is
    /// unreachable. The deliveries stay unacked meanwhile, so a full
    /// prefetch window also stops the broker from pushing more.
    async fn decide(&self, batch: &[Incoming], halt: &CancellationToken) -> Option<Vec<Decision>> {
        let backoff = self.engine.options().backoff;
        let mut attempt = 1;
        loop {
            match self.engine.process(batch).await {
                Ok(decisions) => return Some(decisions),
                Err(e) => {
                    let wait = backoff.after_attempt(attempt);
                    tracing::warn!(queue = %self.queue, error = %e, attempt, ?wait, "store unavailable; batch kept unacked");
                    tokio::select! {
                        _ = halt.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    attempt += 1;
                }
            }
        }
    }
}
