//! Brokers: turn deliveries into `engine::Incoming` and apply the engine's
//! decisions (commit/ack, dead-letter, retry later). No SQL here.

pub mod amqp;
pub mod envelope;
pub mod kafka;
