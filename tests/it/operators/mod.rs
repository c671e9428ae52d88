//! What operators and newcomers touch: /metrics, /readyz, `dedupq keys`,
//! the README's commands and configuration.

mod alerts_runbook;
mod cli_clock_skew;
mod compose;
mod dlq_amqp;
mod dlq_amqp_unreadable;
mod dlq_kafka;
mod dlq_reach;
mod held_unknown;
mod keys_cli;
mod keys_operations;
mod logs;
mod metrics_endpoint;
mod readme;
mod release_live_lease;
mod retention_horizons;
mod retention_replay;
mod upkeep_leader;
