//! The seam between the engine and the transports: a transport hands over
//! a batch of deliveries and applies one decision per delivery. Both the
//! leased engine ([`super::Engine`]) and the same-database engine
//! ([`super::TransactionalEngine`]) implement it, so either runs behind
//! Kafka, RabbitMQ or the HTTP API.

use super::decision::Decision;
use super::message::{Incoming, Parsed, Parser};
use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::store::StoreError;
use async_trait::async_trait;
use std::time::Duration;

/// Why a batch was not decided. Nothing of it is final: commit, ack and
/// answer nothing of it; deliver it again later.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// The key table cannot be used now (an outage of PostgreSQL: see
    /// [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider is in an outage: intake is paused and nothing was
    /// claimed; the next probe may start after `retry_after`.
    #[error("the provider is in an outage: intake paused, next probe in {retry_after:?}")]
    Provider {
        /// When to try again.
        retry_after: Duration,
    },
}

impl Unavailable {
    /// How long to wait before trying again, when the cause says.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Unavailable::Store(_) => None,
            Unavailable::Provider { retry_after } => Some(*retry_after),
        }
    }
}

/// An engine as the transports see it: batches in, one decision per
/// message out.
#[async_trait]
pub trait Pipeline: Send + Sync + 'static {
    /// One decision per message, in order. An error means the store is
    /// out of reach or intake is paused for a provider outage: nothing of
    /// the batch is durable, deliver it again.
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, Unavailable>;

    /// The same for messages the transport already read with
    /// [`Pipeline::parser`] (the HTTP API checks each request before it
    /// decides it): `parsed[i]` is what that parser made of `batch[i]`.
    /// An engine may use it instead of parsing again.
    async fn process_parsed(
        &self,
        batch: &[Incoming],
        parsed: Vec<Parsed>,
    ) -> Result<Vec<Decision>, Unavailable> {
        debug_assert_eq!(batch.len(), parsed.len());
        self.process(batch).await
    }

    /// The identity rules (AMQP reads the key header's name for its
    /// `message_id` fallback).
    fn parser(&self) -> &Parser;

    /// Where the transport records its own metrics (dead letters, replies,
    /// end-to-end time).
    fn metrics(&self) -> &Metrics;

    /// How long to wait between tries while the store is out of reach
    /// (at least; a paused provider may ask for longer).
    fn backoff(&self) -> Backoff;
}
