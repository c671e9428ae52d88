//! RabbitMQ consumer with manual acks: a delivery is acked only after its
//! outcome is durable (result stored, or dead letter / delay-queue copy /
//! reply confirmed by the broker).

mod apply;
mod batch;

mod connection;
mod consumer;
mod delivery;
mod error;
pub mod headers;
mod publish;
mod runner;
mod topology;

pub use crate::config::{AmqpSettings, QueueType, Topology};
pub use apply::RETRY_LIMIT;
pub use error::AmqpError;
pub use runner::run;
