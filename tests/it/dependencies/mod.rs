//! Hostile dependencies against the real services: a PostgreSQL that
//! fails over (for real, to its promoted synchronous standby; or as a
//! client sees it, to read-only), times statements out, has a row locked from
//! another session, refuses new connections or has its disk full; a
//! provider in an outage, rate-limiting, or answering 5xx after it acted;
//! a worker paused past its lease. None of them may change a stored outcome, drop an
//! answer the provider gave, or give a payment up for good.

mod common;
mod connections;
mod disk_full;
mod durable_commits;
mod failover;
mod faults;
mod forgotten_flows;
mod paused_worker;
mod provider_outage;
mod rate_limit;
mod read_only;
mod row_locks;
