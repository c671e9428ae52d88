//! Kafka consumer-group member.

mod config;

pub use config::KafkaSettings;
