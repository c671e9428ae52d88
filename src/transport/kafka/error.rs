//! What can stop the Kafka transport. Everything else (broker outages,
//! store outages, bad messages) is paused through or dead-lettered.

/// Why the Kafka transport cannot start or go on; each one stops dedupq.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A `[kafka]` setting is unusable, or the cluster does not fit it: a
    /// dead-letter or reply topic is missing while `kafka.create_topics`
    /// is off, creating one failed, or a source topic's configuration
    /// cannot be read. Found at start-up.
    #[error("invalid setting `kafka.{setting}`: {problem}")]
    Config {
        /// The setting's name under `kafka.`.
        setting: &'static str,
        /// What is wrong, and how to fix it.
        problem: String,
    },
    /// A `[kafka]` setting fails the checks of `KafkaSettings::validate`
    /// (settings built in code; loaded ones were checked at load).
    #[error(transparent)]
    Settings(crate::config::ConfigError),
    /// librdkafka refused the client configuration (consumer, producer or
    /// admin client).
    #[error("creating the Kafka client failed")]
    Client(#[source] rdkafka::error::KafkaError),
    /// A start-up request to the cluster failed: reading topic metadata
    /// or configuration, or creating the produced topics.
    #[error("a Kafka admin request failed")]
    Admin(#[source] rdkafka::error::KafkaError),
    /// The consumer could not subscribe to `kafka.topics`.
    #[error("subscribing to the Kafka topics failed")]
    Subscribe(#[source] rdkafka::error::KafkaError),
    /// A batch task died; its partitions cannot be tracked any more, so the
    /// consumer stops and the uncommitted messages come back on restart.
    #[error("a Kafka batch task failed")]
    BatchTask(#[source] tokio::task::JoinError),
    /// librdkafka put the consumer in its fatal state: it will never
    /// consume or commit again. In-flight batches were drained; what was
    /// not committed comes back to the group's other members and meets
    /// its stored key.
    #[error("{}", fatal_message(*.code, .reason, .group, .instance.as_deref()))]
    Fatal {
        /// librdkafka's underlying error.
        code: rdkafka::types::RDKafkaErrorCode,
        /// librdkafka's account of it.
        reason: String,
        /// `kafka.group_id`.
        group: String,
        /// `group.instance.id` from `[kafka.client]`, if set.
        instance: Option<String>,
    },
}

/// What a fatal consumer error says: for a fenced static member, which
/// setting two processes share.
fn fatal_message(
    code: rdkafka::types::RDKafkaErrorCode,
    reason: &str,
    group: &str,
    instance: Option<&str>,
) -> String {
    match (code, instance) {
        (rdkafka::types::RDKafkaErrorCode::FencedInstanceId, Some(id)) => format!(
            "invalid setting `kafka.client.group.instance.id`: another consumer joined group \
             `{group}` as `{id}`, and the broker fenced this one ({reason}); give every dedupq \
             process its own `group.instance.id` (e.g. DEDUPQ__KAFKA__CLIENT__GROUP_INSTANCE_ID \
             set to the pod's name)"
        ),
        _ => format!("the Kafka consumer hit a fatal error and cannot go on: {reason}"),
    }
}

impl KafkaError {
    /// A start-up request that no broker answered (none reachable, the
    /// request timed out, as while the cluster restarts): waiting cures it.
    /// A refusal (authentication, authorisation) or a cluster that does not
    /// fit the settings does not.
    pub fn is_unreachable(&self) -> bool {
        use rdkafka::error::{KafkaError as Rd, RDKafkaErrorCode as Code};
        let Self::Admin(e) = self else {
            return false;
        };
        let code = match e {
            Rd::AdminOp(code) => Some(*code),
            other => other.rdkafka_error_code(),
        };
        matches!(
            code,
            Some(
                Code::BrokerTransportFailure
                    | Code::Resolve
                    | Code::AllBrokersDown
                    | Code::OperationTimedOut
                    | Code::TimedOutQueue
                    | Code::RequestTimedOut
                    | Code::BrokerNotAvailable
                    | Code::NetworkException
            )
        )
    }
}

/// Why a dead-letter or reply record could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The broker did not confirm the record. A dead letter is retried
    /// with backoff until confirmed, so this reaches the caller for a
    /// reply (given up after a few tries and counted; the outcome stays
    /// stored).
    #[error("producing to {topic} failed")]
    Delivery {
        /// The topic produced to.
        topic: String,
        /// The broker will refuse it again (too large, no such topic).
        permanent: bool,
        /// What librdkafka said.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// Shutdown came first. The source offset of a dead letter is not
    /// committed, so its message is consumed again after the restart.
    #[error("shutting down before {topic} confirmed the record")]
    Shutdown {
        /// The topic produced to.
        topic: String,
    },
}
