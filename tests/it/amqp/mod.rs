//! The RabbitMQ transport against real RabbitMQ and PostgreSQL: every test
//! has its own schema, work queue, delay queue and dead-letter exchange.

mod ambiguous;
mod blocked;
mod crash;
mod cross_transport;
mod duplicates;
mod in_flight;
mod permissions;
mod poison;
mod refused_replies;
mod secrets;
mod topology;
mod unreadable;

use crate::support;
use crate::support::amqp::{Client, Running};
use crate::support::handlers::Recording;
use dedupq::engine::Engine;
use dedupq::health::Component;
use dedupq::store::Store;
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use std::sync::Arc;
use std::time::Duration;

/// An engine with a recording handler, the transport running in-process
/// on fresh queues, and a client to publish and read back.
pub struct Harness {
    pub store: Store,
    pub handler: Arc<Recording>,
    pub engine: Engine,
    pub settings: AmqpSettings,
    pub client: Client,
    running: Option<Running>,
}

impl Harness {
    pub async fn start(queue_type: QueueType, handler: Recording) -> Self {
        Self::start_with(support::amqp::settings(queue_type), handler).await
    }

    pub async fn start_with(settings: AmqpSettings, handler: Recording) -> Self {
        let (store, _) = support::isolated_store().await;
        let handler = Arc::new(handler);
        let engine = support::engine(&store, handler.clone(), support::fast_options());
        let client = Client::connect().await;
        let running = Running::start(&settings, &engine);
        let health = running.health.clone();
        support::eventually(Duration::from_secs(15), "the transport consumes", || {
            let up = health.get(Component::Amqp) == Some(true);
            async move { up.then_some(()) }
        })
        .await;
        Self {
            store,
            handler,
            engine,
            settings,
            client,
            running: Some(running),
        }
    }

    pub fn queue(&self) -> &str {
        &self.settings.queues[0]
    }

    /// Deliveries the engine decided with this outcome label.
    pub fn decided(&self, outcome: &str) -> u64 {
        self.engine
            .metrics()
            .messages
            .with_label_values(&["amqp", outcome])
            .get()
    }

    /// Stops the transport, checks that nothing was left behind (unacked
    /// deliveries return to the queue when the transport stops) and
    /// removes the queues.
    pub async fn finish(self) {
        let settings = self.settings.clone();
        let client = self.finish_keeping_queues().await;
        client.cleanup(&settings).await;
    }

    /// Stops the transport and checks that nothing was left behind; the
    /// queues stay (for the next test step).
    pub async fn finish_keeping_queues(mut self) -> Client {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("the transport stops cleanly");
        }
        let work = self.queue().to_string();
        assert_eq!(self.client.ready(&work).await, 0, "work queue is empty");
        let delay = self.settings.delay_queue(&work);
        assert_eq!(self.client.ready(&delay).await, 0, "delay queue is empty");
        self.client
    }
}
