//! The HTTP API against the real server: PostgreSQL, Kafka, RabbitMQ and
//! the provider simulator. Every test has its own schema, port, topic and
//! queue names.

mod harness;

mod async_routes;
mod broker_alarm;
mod config;
mod connections;
mod crash;
mod cross_transport;
mod forwarded;
mod group_commit;
mod idle_sessions;
mod key_routes;
mod open_files;
mod pooler;
mod requests;
mod rotation;
mod row_lock;
mod seed;
mod shutdown;
mod store_faults;
mod webhooks;
