use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// Topics to consume; empty: the Kafka transport is off.
    pub topics: Vec<String>,
    pub brokers: String,
    pub group_id: String,
    /// Dead letters go to `<topic><dlq_suffix>`.
    pub dlq_suffix: String,
    /// If set, every outcome (fresh or stored) is produced here, keyed by
    /// the idempotency key.
    pub reply_topic: Option<String>,
    /// Extra librdkafka properties (e.g. security.protocol, sasl.*, ssl.*),
    /// passed through to both consumer and producer.
    pub client: BTreeMap<String, String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            topics: Vec::new(),
            brokers: "127.0.0.1:9092".into(),
            group_id: "dedupq".into(),
            dlq_suffix: ".dlq".into(),
            reply_topic: None,
            client: BTreeMap::new(),
        }
    }
}
