//! Sessions: connect, prepare the topology, start one worker per queue, and
//! when anything breaks, tear it all down and start again with backoff.
//! Unacked deliveries of a dead session come back from the broker (as
//! `redelivered`, though nothing relies on that flag) and are claimed again.
//!
//! A message the client library cannot parse (a property or header name
//! that is not UTF-8) ends the session before dedupq sees it. The broker
//! bounds it (`amqp.delivery_limit`: it dead-letters a message delivered
//! that often), and after a failed session the next one consumes one
//! delivery at a time for a while, so only the offending message's count
//! grows, never its neighbours'.

use super::consumer::Worker;
use super::error::AmqpError;
use super::progress::Progress;
use super::topology;
use crate::backoff::Backoff;
use crate::broker::amqp::connect;
use crate::config::AmqpSettings;
use crate::engine::Pipeline;
use crate::health::{Component, Health};
use crate::message::Transport;
use futures::StreamExt;
use lapin::{Connection, Event};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Longest wait for the broker to acknowledge closing the connection.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often stalled queues are looked for.
const STALL_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Consumes the configured queues until `shutdown`. Returns an error only
/// for a configuration that no reconnect can fix.
pub async fn run(
    settings: AmqpSettings,
    pipeline: Arc<dyn Pipeline>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), AmqpError> {
    settings.validate()?;
    let settings = Arc::new(settings);
    let backoff = Backoff::new(
        settings.reconnect_backoff_min,
        settings.reconnect_backoff_max,
    );
    let session = Session {
        settings: settings.clone(),
        pipeline,
        health,
        progress: Arc::default(),
    };
    // Configured but not consuming yet: not ready.
    session.mark(false);
    let reporter = tokio::spawn(session.report_stalls(shutdown.clone()));
    let mut attempt = 1;
    let mut cautious = false;
    let result = loop {
        let (result, established) = session.run(&shutdown, cautious).await;
        session.mark(false);
        match result {
            Ok(()) => break Ok(()),
            Err(e) if e.is_fatal() => break Err(e),
            Err(e) => {
                if established {
                    attempt = 1;
                }
                let error = crate::telemetry::chain(&e).to_string();
                session.progress.session_failed(&error);
                cautious = true;
                let wait = backoff.after_attempt(attempt);
                tracing::warn!(%error, attempt, ?wait, "RabbitMQ session ended; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => break Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt = attempt.saturating_add(1);
            }
        }
    };
    reporter.abort();
    result
}

struct Session {
    settings: Arc<AmqpSettings>,
    pipeline: Arc<dyn Pipeline>,
    health: Health,
    progress: Arc<Progress>,
}

impl Session {
    /// One connection's life. The flag says whether consuming started.
    async fn run(
        &self,
        shutdown: &CancellationToken,
        cautious: bool,
    ) -> (Result<(), AmqpError>, bool) {
        let connection = tokio::select! {
            c = connect(&self.settings, &self.settings.connection_name) => match c {
                // Shared with the workers, which open publishing channels
                // again on it.
                Ok(c) => Arc::new(c),
                Err(e) => return (Err(e.into()), false),
            },
            _ = shutdown.cancelled() => return (Ok(()), false),
        };
        let mut established = false;
        let result = self
            .consume(&connection, shutdown, cautious, &mut established)
            .await;
        // Closing returns every unacked delivery to its queue at once. A
        // broker that does not answer must not hold shutdown: bounded.
        let closed = tokio::time::timeout(
            CLOSE_TIMEOUT,
            connection.close(200, "dedupq session over".into()),
        )
        .await;
        if closed.is_err() {
            tracing::warn!("RabbitMQ did not confirm closing the connection; dropping it");
        }
        (result, established)
    }

    async fn consume(
        &self,
        connection: &Arc<Connection>,
        shutdown: &CancellationToken,
        cautious: bool,
        established: &mut bool,
    ) -> Result<(), AmqpError> {
        let mut events = connection.events_listener();
        let prepare = topology::prepare(connection, &self.settings);
        tokio::select! {
            r = prepare => r?,
            _ = shutdown.cancelled() => return Ok(()),
        }
        let mut workers = Vec::with_capacity(self.settings.queues.len());
        for queue in &self.settings.queues {
            let worker = Worker::start(
                connection,
                queue,
                self.settings.clone(),
                self.pipeline.clone(),
                self.progress.clone(),
                cautious,
            )
            .await?;
            workers.push(worker);
        }
        self.mark(true);
        self.progress.session_up();
        *established = true;
        tracing::info!(queues = ?self.settings.queues, url = %self.settings.url, "consuming from RabbitMQ");

        // Workers stop taking batches when this fires; the batches in hand
        // get amqp.drain_timeout (their acks fail harmlessly if the channel
        // is gone).
        let stop = shutdown.child_token();
        let mut tasks = JoinSet::new();
        for (worker, queue) in workers.into_iter().zip(&self.settings.queues) {
            let heartbeat = self
                .health
                .liveness()
                .register(format!("amqp consumer {queue}"));
            tasks.spawn(worker.run(stop.clone(), heartbeat));
        }
        let mut first_error = None;
        loop {
            tokio::select! {
                done = tasks.join_next() => {
                    let Some(done) = done else { break };
                    let outcome = done.unwrap_or_else(|e| Err(AmqpError::Task(e.to_string())));
                    if let Err(e) = outcome {
                        first_error.get_or_insert(e);
                    }
                    stop.cancel();
                }
                Some(event) = events.next(), if !stop.is_cancelled() => match event {
                    // The broker closed one channel (a refused publish
                    // closes the publishing channel); the connection and
                    // the other channels go on. Whoever uses that channel
                    // sees it on its next call: the publisher opens a new
                    // one, a consumer's stream ends, which ends the session.
                    Event::Error(e) if e.is_amqp_soft_error() => {
                        tracing::debug!(error = %e, "RabbitMQ closed a channel");
                    }
                    Event::Error(e) => {
                        first_error.get_or_insert(AmqpError::ConnectionLost(e));
                        stop.cancel();
                    }
                    Event::ConnectionBlocked(reason) => {
                        tracing::warn!(
                            %reason,
                            "RabbitMQ blocks this connection (a resource alarm): deliveries in hand are stored, their acks, replies and dead letters wait until it clears"
                        );
                        self.blocked(Some(reason));
                    }
                    Event::ConnectionUnblocked => {
                        tracing::info!("RabbitMQ unblocked this connection");
                        self.blocked(None);
                    }
                    _ => {}
                },
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether RabbitMQ blocks the connection, and why: shown on the
    /// stalled queues' lines and in `dedupq_amqp_blocked`.
    fn blocked(&self, reason: Option<String>) {
        self.pipeline
            .metrics()
            .amqp_blocked
            .set(i64::from(reason.is_some()));
        self.progress.blocked(reason);
    }

    fn mark(&self, up: bool) {
        if !up {
            // A connection that ended blocks nothing.
            self.blocked(None);
        }
        self.health.set(Component::Amqp, up);
        self.pipeline
            .metrics()
            .broker_up
            .with_label_values(&[Transport::Amqp.label()])
            .set(i64::from(up));
    }

    fn report_stalls(
        &self,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (progress, settings, health, metrics) = (
            self.progress.clone(),
            self.settings.clone(),
            self.health.clone(),
            self.pipeline.metrics().clone(),
        );
        async move {
            let mut tick = tokio::time::interval(STALL_CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => progress.report(&settings.queues, settings.stall_after, &health, &metrics),
                }
            }
        }
    }
}
