//! What operators and newcomers touch: /metrics, /readyz, `dedupq keys`,
//! the README's commands and configuration.

#[path = "../support/mod.rs"]
mod support;

mod alerts_runbook;
mod compose;
mod dlq_amqp;
mod dlq_kafka;
mod keys_cli;
mod keys_operations;
mod logs;
mod metrics_endpoint;
mod readme;
mod upkeep_leader;
