use crate::config::SecretUrl;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSettings {
    /// Work queues to consume; empty: the RabbitMQ transport is off.
    pub queues: Vec<String>,
    pub url: SecretUrl,
    /// Unacked deliveries the broker may push at once; claims are batched
    /// over this window.
    pub prefetch: u16,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            url: SecretUrl::new("amqp://guest:guest@127.0.0.1:5672/%2f"),
            prefetch: 256,
        }
    }
}
