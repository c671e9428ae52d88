//! One work queue: consume with manual acks, batch the prefetch window,
//! let the pipeline decide, apply the decisions. Several batches may be in
//! flight, so a slow handler does not stall the queue.

use super::apply::Applier;
use super::collect::{next_batch, Next};
use super::delivery::receive;
use super::error::AmqpError;
use super::progress::Progress;
use crate::backoff;
use crate::broker::amqp::Reopening;
use crate::config::AmqpSettings;
use crate::engine::{Decision, Incoming, Pipeline};
use crate::liveness::Heartbeat;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long the cancelled cautious consumer may take to hand over what it
/// holds; past it the session is rebuilt (which returns everything).
const CANCELLED_CONSUMER_END: Duration = Duration::from_secs(5);

pub(super) struct Worker {
    shared: Arc<QueueContext>,
    channel: Channel,
    consumer: Consumer,
    /// Consuming one delivery at a time after a failed session, until
    /// `amqp.cautious_acks` acks; then the normal prefetch.
    cautious: bool,
}

/// What every batch task of one queue needs.
struct QueueContext {
    queue: String,
    settings: Arc<AmqpSettings>,
    pipeline: Arc<dyn Pipeline>,
    publisher: Reopening,
    progress: Arc<Progress>,
    acked: AtomicUsize,
}

impl Worker {
    /// Opens the worker's channels and starts consuming.
    pub(super) async fn start(
        connection: &Arc<Connection>,
        queue: &str,
        settings: Arc<AmqpSettings>,
        pipeline: Arc<dyn Pipeline>,
        progress: Arc<Progress>,
        cautious: bool,
    ) -> Result<Self, AmqpError> {
        let publisher = Reopening::open(connection.clone()).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::channel("channel.open"))?;
        let prefetch = if cautious { 1 } else { settings.prefetch };
        let consumer = consume(&channel, queue, prefetch).await?;
        if cautious {
            tracing::info!(
                queue,
                acks = settings.cautious_acks,
                "after a failed session: consuming one delivery at a time for a while"
            );
        }
        Ok(Self {
            shared: Arc::new(QueueContext {
                queue: queue.to_string(),
                settings,
                pipeline,
                publisher,
                progress,
                acked: AtomicUsize::new(0),
            }),
            channel,
            consumer,
            cautious,
        })
    }

    /// Runs until `stop` or until a batch or the channel fails. Batches in
    /// hand then get `amqp.drain_timeout` to finish; the rest are dropped
    /// unacked and come back.
    ///
    /// `heartbeat` beats every round and through each wait (for deliveries,
    /// for a permit while batches run, for the batches themselves).
    pub(super) async fn run(
        mut self,
        stop: CancellationToken,
        heartbeat: Heartbeat,
    ) -> Result<(), AmqpError> {
        let settings = self.shared.settings.clone();
        // Fires on `stop` or on the first failed batch.
        let halt = stop.child_token();
        let failure: Arc<Mutex<Option<AmqpError>>> = Arc::default();
        let permits = Arc::new(Semaphore::new(settings.max_batches_in_flight));
        let mut tasks = JoinSet::new();
        loop {
            heartbeat.beat();
            if self.cautious
                && self.shared.acked.load(Ordering::Relaxed) >= settings.cautious_acks as usize
            {
                // Every wait here ends at `halt`: what is still running is
                // then given the bounded drain below, as anywhere else. A
                // batch can wait for good: lapin drops an ack whose channel
                // died after the ack was asked for, and never resolves it.
                if until_halted(&halt, &heartbeat, all_done(&mut tasks))
                    .await
                    .is_none()
                {
                    break;
                }
                match until_halted(&halt, &heartbeat, self.leave_caution()).await {
                    None => break,
                    // Delivered to the cautious consumer before its cancel:
                    // first in the queue's order, so handled before any
                    // delivery of the new consumer.
                    Some(Ok(left)) if !left.is_empty() => {
                        self.spawn_batch(&mut tasks, left, &halt, &failure, None);
                        if until_halted(&halt, &heartbeat, all_done(&mut tasks))
                            .await
                            .is_none()
                        {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        record(&failure, e);
                        break;
                    }
                }
            }
            // Waiting for a permit or for the first delivery takes nothing,
            // so being halted there loses nothing.
            let permit = heartbeat
                .waiting(async {
                    tokio::select! {
                        biased;
                        _ = halt.cancelled() => None,
                        permit = permits.clone().acquire_owned() => permit.ok(),
                    }
                })
                .await;
            let Some(permit) = permit else { break };
            let max = if self.cautious {
                1
            } else {
                usize::from(settings.prefetch)
            };
            let next = next_batch(&mut self.consumer, max, settings.batch_linger, &halt);
            let deliveries = match heartbeat.waiting(next).await {
                Next::Batch(d) => d,
                Next::Stopped => break,
                Next::Ended(source) => {
                    let queue = self.shared.queue.clone();
                    record(&failure, AmqpError::ConsumerEnded { queue, source });
                    break;
                }
            };
            self.spawn_batch(&mut tasks, deliveries, &halt, &failure, Some(permit));
            while tasks.try_join_next().is_some() {}
        }
        // The drain is bounded by amqp.drain_timeout, not watched.
        drop(heartbeat);
        let drained = tokio::time::timeout(settings.drain_timeout, async {
            while let Some(done) = tasks.join_next().await {
                if let Err(e) = done {
                    record(&failure, AmqpError::Task(e.to_string()));
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(queue = %self.shared.queue, batches = tasks.len(),
                "batches still running after amqp.drain_timeout; their deliveries stay unacked and come back");
            tasks.abort_all();
        }
        let first = failure.lock().unwrap_or_else(|e| e.into_inner()).take();
        first.map_or(Ok(()), Err)
    }

    /// Handles `deliveries` in a task of `tasks`; its failure is recorded
    /// and halts the worker. The permit, if any, is held until it ends.
    fn spawn_batch(
        &self,
        tasks: &mut JoinSet<()>,
        deliveries: Vec<Delivery>,
        halt: &CancellationToken,
        failure: &Arc<Mutex<Option<AmqpError>>>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let (shared, halt, failure) = (self.shared.clone(), halt.clone(), failure.clone());
        tasks.spawn(async move {
            if let Err(e) = shared.handle(deliveries, &halt).await {
                record(&failure, e);
                halt.cancel();
            }
            drop(permit);
        });
    }

    /// Enough deliveries went through one at a time: consume with the
    /// normal prefetch again (a new consumer on the same channel). The
    /// broker may have pushed the next delivery to the cautious consumer
    /// before its cancel arrived: a cancel does not return it, so it would
    /// stay unacked on this channel until the channel closes. What the old
    /// consumer still holds is returned here, for the caller to handle.
    async fn leave_caution(&mut self) -> Result<Vec<Delivery>, AmqpError> {
        self.channel
            .basic_cancel(self.consumer.tag(), BasicCancelOptions { nowait: false })
            .await
            .map_err(AmqpError::channel("basic.cancel"))?;
        let mut left = Vec::new();
        let queue = || self.shared.queue.clone();
        // The cancel-ok ends the old consumer's stream after what it holds.
        let ended = tokio::time::timeout(CANCELLED_CONSUMER_END, async {
            while let Some(next) = self.consumer.next().await {
                left.push(next?);
            }
            Ok(())
        })
        .await;
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                let queue = queue();
                return Err(AmqpError::ConsumerEnded {
                    queue,
                    source: Some(source),
                });
            }
            Err(_) => {
                let queue = queue();
                return Err(AmqpError::ConsumerEnded {
                    queue,
                    source: None,
                });
            }
        }
        self.consumer = consume(
            &self.channel,
            &self.shared.queue,
            self.shared.settings.prefetch,
        )
        .await?;
        self.cautious = false;
        tracing::info!(queue = %self.shared.queue, prefetch = self.shared.settings.prefetch,
            held = left.len(), "consuming with the normal prefetch again");
        Ok(left)
    }
}

async fn consume(channel: &Channel, queue: &str, prefetch: u16) -> Result<Consumer, AmqpError> {
    // Per consumer: the window batches are collected from.
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
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
    channel
        .basic_consume(queue.into(), "".into(), options, FieldTable::default())
        .await
        .map_err(AmqpError::channel("basic.consume"))
}

/// Waits for every batch task to end.
async fn all_done(tasks: &mut JoinSet<()>) {
    while tasks.join_next().await.is_some() {}
}

/// What `work` gives, or `None` if `halt` fires first; the heartbeat
/// beats meanwhile.
async fn until_halted<T>(
    halt: &CancellationToken,
    heartbeat: &Heartbeat,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    heartbeat
        .waiting(async {
            tokio::select! {
                biased;
                _ = halt.cancelled() => None,
                done = work => Some(done),
            }
        })
        .await
}

fn record(slot: &Mutex<Option<AmqpError>>, e: AmqpError) {
    slot.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(e);
}

impl QueueContext {
    async fn handle(
        &self,
        deliveries: Vec<Delivery>,
        halt: &CancellationToken,
    ) -> Result<(), AmqpError> {
        let key_header = self.pipeline.parser().key_header();
        let limit = self.settings.max_redeliveries;
        let (batch, metas): (Vec<_>, Vec<_>) = deliveries
            .into_iter()
            .map(|d| receive(&self.queue, key_header, limit, d))
            .unzip();
        let n = batch.len();
        self.progress.taken(&self.queue, n);
        let redelivered = metas.iter().filter(|m| m.redelivered).count();
        tracing::debug!(queue = %self.queue, size = n, redelivered, "batch");
        let Some(decisions) = self.decide(&batch, halt).await else {
            // Halted during a store outage: nothing is acked; the broker
            // redelivers the batch to whoever consumes next.
            self.progress.settled(&self.queue, n, 0);
            return Ok(());
        };
        let applier = Applier {
            settings: &self.settings,
            queue: &self.queue,
            publisher: &self.publisher,
            metrics: self.pipeline.metrics(),
        };
        let (acked, result) = applier.apply(batch, metas, decisions).await;
        self.acked.fetch_add(acked, Ordering::Relaxed);
        self.progress.settled(&self.queue, n, acked);
        result
    }

    /// The pipeline's decisions, retrying the whole batch while PostgreSQL
    /// is unreachable. The deliveries stay unacked meanwhile, so a full
    /// prefetch window also stops the broker from pushing more.
    async fn decide(&self, batch: &[Incoming], halt: &CancellationToken) -> Option<Vec<Decision>> {
        let queue = &self.queue;
        let decided = backoff::wait_out(
            self.pipeline.backoff(),
            halt,
            |_| true,
            |e, attempt, wait| {
                tracing::warn!(%queue, error = %crate::telemetry::chain(e), attempt, ?wait,
                    "store unavailable; batch kept unacked")
            },
            || self.pipeline.process(batch),
        )
        .await;
        decided.ok()
    }
}
