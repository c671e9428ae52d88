//! RabbitMQ consumer with manual acks.

mod config;

pub use config::AmqpSettings;
