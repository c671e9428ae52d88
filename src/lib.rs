//! dedupq: exactly-once effects over at-least-once Kafka and RabbitMQ
//! delivery. Each message's idempotency key is claimed in PostgreSQL before
//! any work, the handler runs, its outcome is stored, and only then is the
//! offset committed or the delivery acked.

#![warn(missing_docs)]

pub mod backoff;
pub mod broker;
#[doc(hidden)]
pub mod cli;
pub mod config;
pub mod engine;
pub mod fingerprint;
pub mod handler;
pub mod health;
pub mod identity;
pub mod json;
mod maintenance;
pub mod message;
pub mod metrics;
pub mod retention;
pub mod server;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod transport;
