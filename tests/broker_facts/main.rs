//! Facts about the real brokers that dedupq's handling of hostile input
//! rests on, and the tools that produce such input: raw Kafka headers,
//! raw AMQP publishing, and how RabbitMQ's quorum queues count deliveries
//! that a client library cannot even parse.

#[path = "../support/mod.rs"]
mod support;

mod kafka_raw_headers;
mod raw_amqp_publish;
