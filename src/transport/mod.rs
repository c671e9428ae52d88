//! The ways in: Kafka, RabbitMQ and HTTP turn deliveries and requests into
//! `engine::Incoming` and apply the engine's decisions (commit/ack,
//! dead-letter, retry later; answer). No SQL here.

pub mod amqp;
pub mod envelope;
pub mod http;
pub mod kafka;
