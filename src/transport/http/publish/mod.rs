//! Async routes hand the command to a broker and answer 202 only once the
//! broker confirmed it; the consumers of that topic or queue claim it like
//! any other message.

mod amqp;
mod kafka;

pub(super) use amqp::AmqpPublisher;
pub(super) use kafka::KafkaPublisher;

use super::answer::SOON;
use super::decide::Publication;
use super::problem::Problem;
use crate::config::{PublishTarget, Settings};
use axum::http::StatusCode;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub(super) enum PublishError {
    #[error("Kafka did not confirm the record on {topic}")]
    Kafka {
        topic: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("RabbitMQ could not be reached")]
    AmqpConnect(#[from] crate::broker::amqp::ConnectError),
    #[error("RabbitMQ did not take the command")]
    Amqp(#[from] crate::broker::amqp::PublishError),
    #[error("RabbitMQ blocks publishing (a memory or disk alarm on the broker)")]
    AmqpBlocked,
    #[error("the broker did not confirm the command within api.request_timeout")]
    Timeout,
}

impl PublishError {
    /// Whether the broker may have the command although it did not
    /// confirm it: the wait ran out, the connection went after the message
    /// was written (a blocked RabbitMQ connection writes it once the alarm
    /// clears), or librdkafka gave up on a record it may have sent.
    fn may_have_reached_the_broker(&self) -> bool {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        match self {
            PublishError::Timeout => true,
            PublishError::Amqp(e) => e.may_have_reached_the_broker(),
            PublishError::Kafka { source, .. } => matches!(
                source,
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
            ),
            PublishError::AmqpConnect(_) | PublishError::AmqpBlocked => false,
        }
    }
}

impl From<PublishError> for Problem {
    fn from(e: PublishError) -> Self {
        let detail = crate::telemetry::chain(&e);
        if e.may_have_reached_the_broker() {
            // Never "nothing is accepted" when the broker may carry it out:
            // the consumers claim it like any delivery, so a retry with the
            // same key is never carried out twice.
            return Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "broker-unconfirmed",
                "The broker has not confirmed the command; it may still be carried out",
                format!("{detail}; retry with the same key: the command is carried out once, however often it is sent"),
            )
            .retry_after(SOON);
        }
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker-unavailable",
            "The command could not be handed to the broker; nothing is accepted",
            format!("{detail}; retry with the same key"),
        )
        .retry_after(SOON)
    }
}

/// The broker clients of the configured async routes, shared by routes.
#[derive(Default)]
pub(super) struct Publishers {
    kafka: Option<Arc<KafkaPublisher>>,
    amqp: Option<Arc<AmqpPublisher>>,
}

/// Where one async route publishes.
#[derive(Clone)]
pub(super) enum Destination {
    Kafka {
        publisher: Arc<KafkaPublisher>,
        topic: String,
    },
    Amqp {
        publisher: Arc<AmqpPublisher>,
        exchange: String,
        routing_key: String,
    },
}

impl Publishers {
    /// Clients only for the brokers some route publishes to.
    pub(super) fn new(s: &Settings) -> Result<Self, rdkafka::error::KafkaError> {
        let targets: Vec<&PublishTarget> = s
            .api
            .routes
            .iter()
            .filter_map(|r| r.publish.as_ref())
            .collect();
        let kafka = targets
            .iter()
            .any(|t| matches!(t, PublishTarget::Kafka { .. }))
            .then(|| KafkaPublisher::new(&s.kafka).map(Arc::new))
            .transpose()?;
        let amqp = targets
            .iter()
            .any(|t| matches!(t, PublishTarget::Amqp { .. }))
            .then(|| Arc::new(AmqpPublisher::new(&s.amqp)));
        Ok(Self { kafka, amqp })
    }

    pub(super) fn destination(&self, target: &PublishTarget) -> Option<Destination> {
        Some(match target {
            PublishTarget::Kafka { topic } => Destination::Kafka {
                publisher: self.kafka.clone()?,
                topic: topic.clone(),
            },
            PublishTarget::Amqp {
                exchange,
                routing_key,
            } => Destination::Amqp {
                publisher: self.amqp.clone()?,
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            },
        })
    }
}

impl Destination {
    /// Returns once the broker confirmed the message.
    pub(super) async fn publish(&self, message: &Publication) -> Result<(), PublishError> {
        match self {
            Destination::Kafka { publisher, topic } => publisher.send(topic, message).await,
            Destination::Amqp {
                publisher,
                exchange,
                routing_key,
            } => publisher.send(exchange, routing_key, message).await,
        }
    }
}
