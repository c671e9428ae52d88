//! The integration tests against real PostgreSQL, Kafka, RabbitMQ and the
//! provider simulator, one module per area, in one binary so the shared
//! helpers (tests/support) and the crate graph are compiled and linked
//! once. Every test has its own schema, topics and queues.
//!
//! The two tests that stop a shared service, `tests/amqp_outage` and
//! `tests/kafka_outage`, are binaries of their own so that nothing else
//! runs while the service is away.

// Helpers are pub for their sibling modules; a test binary has no API.
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

mod amqp;
mod broker_facts;
mod dependencies;
mod deploy;
mod docs;
mod engine;
mod handlers;
mod http;
mod kafka;
mod ledger;
mod observability;
mod operators;
