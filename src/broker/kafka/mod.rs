//! Kafka: the librdkafka configuration of every client (the consumer, the
//! producers, the admin client, the readers of `dedupq dlq` and of the lab),
//! and header names and values as bytes.

mod client;
pub mod headers;
mod renewing;

pub use client::{admin, client, consumer, producer, reader, Producing};
pub use renewing::Renewing;
