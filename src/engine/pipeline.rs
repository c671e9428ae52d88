//! The seam between the engine and the transports: a transport hands over
//! a batch of deliveries and applies one decision per delivery. Both the
//! leased engine ([`super::Engine`]) and the same-database engine
//! ([`super::TransactionalEngine`]) implement it, so either runs behind
//! Kafka, RabbitMQ or the HTTP API.

use super::decision::Decision;
use super::message::{Incoming, Parser};
use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::store::StoreError;
use async_trait::async_trait;

/// An engine as the transports see it: batches in, one decision per
/// message out.
#[async_trait]
pub trait Pipeline: Send + Sync + 'static {
    /// One decision per message, in order. An error means the store is
    /// out of reach: nothing of the batch is durable, deliver it again.
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, StoreError>;

    /// The identity rules (AMQP reads the key header's name for its
    /// `message_id` fallback).
    fn parser(&self) -> &Parser;

    /// Where the transport records its own metrics (dead letters, replies,
    /// end-to-end time).
    fn metrics(&self) -> &Metrics;

    /// How long to wait between tries while the store is out of reach.
    fn backoff(&self) -> Backoff;
}
