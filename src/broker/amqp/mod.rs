//! RabbitMQ: the one lapin connect (TLS with `amqp.tls_ca_file`, heartbeat,
//! connect timeout), the one publish with publisher confirms, and a raw
//! AMQP 0-9-1 client for deliveries lapin cannot parse.

mod connect;
mod publish;
pub mod raw;

pub use connect::{connect, ConnectError};
pub use publish::{Outgoing, Pending, PublishError, Publisher, Reopening};
