//! What can stop the Kafka transport. Everything else (broker outages,
//! store outages, bad messages) is paused through or dead-lettered.

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("invalid setting `kafka.{setting}`: {problem}")]
    Config {
        setting: &'static str,
        problem: String,
    },
    #[error("creating the Kafka client failed")]
    Client(#[source] rdkafka::error::KafkaError),
    #[error("a Kafka admin request failed")]
    Admin(#[source] rdkafka::error::KafkaError),
    #[error("subscribing to the Kafka topics failed")]
    Subscribe(#[source] rdkafka::error::KafkaError),
    /// A batch task died; its partitions cannot be tracked any more, so the
    /// consumer stops and the uncommitted messages come back on restart.
    #[error("a Kafka batch task failed")]
    BatchTask(#[source] tokio::task::JoinError),
}

/// Why a dead-letter or reply record could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("producing to {topic} failed")]
    Delivery {
        topic: String,
        /// The broker will refuse it again (too large, no such topic).
        permanent: bool,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("shutting down before {topic} confirmed the record")]
    Shutdown { topic: String },
}
