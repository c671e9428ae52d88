//! Sessions: connect, prepare the topology, start one worker per queue, and
//! when anything breaks, tear it all down and start again with backoff.
//! Unacked deliveries of a dead session come back from the broker (as
//! `redelivered`, though nothing relies on that flag) and are claimed again.

use super::connection::connect;
use super::consumer::Worker;
use super::error::AmqpError;
use super::topology;
use crate::config::AmqpSettings;
use crate::engine::{Backoff, Engine};
use crate::health::{Component, Health};
use futures::StreamExt;
use lapin::{Connection, Event};
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Consumes the configured queues until `shutdown`. Returns an error only
/// for a configuration that no reconnect can fix.
pub async fn run(
    settings: AmqpSettings,
    engine: Engine,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), AmqpError> {
    settings.validate()?;
    let settings = Arc::new(settings);
    let backoff = Backoff {
        min: settings.reconnect_backoff_min,
        max: settings.reconnect_backoff_max,
    };
    let session = Session {
        settings,
        engine,
        health,
    };
    // Configured but not consuming yet: not ready.
    session.mark(false);
    let mut attempt = 1;
    loop {
        let (result, established) = session.run(&shutdown).await;
        session.mark(false);
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                if established {
                    attempt = 1;
                }
                let wait = backoff.after_attempt(attempt);
                tracing::warn!(error = %chain(&e), attempt, ?wait, "RabbitMQ session ended; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

struct Session {
    settings: Arc<AmqpSettings>,
    engine: Engine,
    health: Health,
}

impl Session {
    /// One connection's life. The flag says whether consuming started.
    async fn run(&self, shutdown: &CancellationToken) -> (Result<(), AmqpError>, bool) {
        let connection = match connect(&self.settings).await {
            Ok(c) => c,
            Err(e) => return (Err(e), false),
        };
        let mut established = false;
        let result = self.consume(&connection, shutdown, &mut established).await;
        // Closing returns every unacked delivery to its queue at once.
        let _ = connection.close(200, "dedupq session over".into()).await;
        (result, established)
    }

    async fn consume(
        &self,
        connection: &Connection,
        shutdown: &CancellationToken,
        established: &mut bool,
    ) -> Result<(), AmqpError> {
        let mut events = connection.events_listener();
        topology::prepare(connection, &self.settings).await?;
        let mut workers = Vec::with_capacity(self.settings.queues.len());
        for queue in &self.settings.queues {
            let worker = Worker::start(
                connection,
                queue,
                self.settings.clone(),
                self.engine.clone(),
            )
            .await?;
            workers.push(worker);
        }
        self.mark(true);
        *established = true;
        tracing::info!(queues = ?self.settings.queues, url = %self.settings.url, "consuming from RabbitMQ");

        // Workers stop taking batches when this fires; the batch in hand is
        // finished (its acks fail harmlessly if the channel is gone).
        let stop = shutdown.child_token();
        let mut tasks = JoinSet::new();
        for worker in workers {
            tasks.spawn(worker.run(stop.clone()));
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
                    Event::Error(e) => {
                        first_error.get_or_insert(AmqpError::ConnectionLost(e));
                        stop.cancel();
                    }
                    Event::ConnectionBlocked(reason) => {
                        tracing::warn!(%reason, "RabbitMQ blocked publishing (resource alarm)");
                    }
                    _ => {}
                },
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn mark(&self, up: bool) {
        self.health.set(Component::Amqp, up);
        self.engine
            .metrics()
            .broker_up
            .with_label_values(&["amqp"])
            .set(i64::from(up));
    }
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
