//! The payment pipeline behind the RabbitMQ transport.

use super::{engine_for, wait_status, Setup, TENANT, WAIT};
use crate::support::{eventually, isolated_store};
use dedupq::engine::Engine;
use dedupq::store::{KeyRow, KeyStatus, Store};

/// The same pipeline behind the RabbitMQ transport, on queues of its own.
pub struct AmqpPayments {
    pub store: Store,
    pub engine: Engine,
    pub settings: dedupq::transport::amqp::AmqpSettings,
    pub client: crate::support::amqp::Client,
    channel: lapin::Channel,
    running: Option<crate::support::amqp::Running>,
}

impl AmqpPayments {
    pub async fn start(setup: Setup) -> Self {
        let (store, _) = isolated_store().await;
        Self::start_on(store, setup).await
    }

    /// The same on a store that already holds rows.
    pub async fn start_on(store: Store, setup: Setup) -> Self {
        let engine = engine_for(&store, setup.handler, setup.max_attempts, &setup.identity);
        let settings = crate::support::amqp::settings(dedupq::transport::amqp::QueueType::Quorum);
        let running = crate::support::amqp::Running::start(&settings, &engine);
        let health = running.health.clone();
        eventually(WAIT, "the transport consumes", || {
            let up = health.get(dedupq::health::Component::Amqp) == Some(true);
            async move { up.then_some(()) }
        })
        .await;
        let client = crate::support::amqp::Client::connect().await;
        let channel = client.connection.create_channel().await.expect("channel");
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .expect("confirm mode");
        Self {
            store,
            engine,
            settings,
            client,
            channel,
            running: Some(running),
        }
    }

    pub fn queue(&self) -> &str {
        &self.settings.queues[0]
    }

    /// Publishes a payment command for `key` into the work queue, with a
    /// `content_type` property if given, and waits for the broker's confirm.
    pub async fn send(&self, key: &str, body: &[u8], content_type: Option<&str>) {
        use lapin::types::{AMQPValue, FieldTable, LongString};
        let mut headers = FieldTable::default();
        headers.insert(
            "client-id".into(),
            AMQPValue::LongString(LongString::from(TENANT)),
        );
        headers.insert(
            "idempotency-key".into(),
            AMQPValue::LongString(LongString::from(key)),
        );
        let mut properties = lapin::BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2);
        if let Some(c) = content_type {
            properties = properties.with_content_type(c.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue().into(),
                lapin::options::BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("publisher confirm");
        assert!(confirm.is_ack(), "the broker took the message");
    }

    pub async fn wait_status(&self, key: &str, status: KeyStatus) -> KeyRow {
        wait_status(&self.store, key, status).await
    }

    /// Deliveries decided with this outcome label.
    pub fn outcomes(&self, outcome: &str) -> u64 {
        self.engine
            .metrics()
            .messages
            .with_label_values(&["amqp", outcome])
            .get()
    }

    /// Waits until `n` deliveries were decided with these outcome labels.
    pub async fn wait_outcomes(&self, outcomes: &[&str], n: u64) {
        let what = format!("{n} deliveries {outcomes:?}");
        eventually(WAIT, &what, || async {
            let got: u64 = outcomes.iter().map(|o| self.outcomes(o)).sum();
            (got >= n).then_some(())
        })
        .await;
    }

    /// Exactly `n` dead letters (waits for them, then checks no more come).
    pub async fn dead_letters(&self, n: usize) -> Vec<crate::support::amqp::Got> {
        self.client
            .expect_exactly(&self.settings.dead_letter_queue, n, WAIT)
            .await
    }

    /// Stops the transport and removes the queues.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("the transport stops cleanly");
        }
        self.client.cleanup(&self.settings).await;
    }
}
