//! RabbitMQ consumer with manual acks: a delivery is acked only after its
//! outcome is durable (result stored, or dead letter / delay-queue copy
//! confirmed by the broker).

mod apply;
mod collect;
mod consumer;
mod delivery;
mod error;
pub(crate) mod headers;
mod progress;
mod runner;
mod topology;

pub use crate::config::{AmqpSettings, QueueType, Topology};
pub use error::AmqpError;
pub use runner::run;
pub use topology::{missing_objects, prepare_alone as prepare_topology};
