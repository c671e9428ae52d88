//! What the dependency tests share: the `dedupq run` configurations on
//! each transport, and reads of the key table.

use crate::support::amqp;
use crate::support::kafka;
use dedupq::store::Store;
use dedupq::transport::amqp::{AmqpSettings, QueueType};

pub const TENANT: &str = "t1";

pub fn body(n: usize) -> String {
    format!(
        r#"{{"amount":{},"currency":"EUR","recipient":"r-{n}"}}"#,
        100 + n
    )
}

/// `base` plus a `[kafka]` section consuming `topic` as `group`.
pub fn with_kafka(base: &toml::Table, topic: &str, group: &str) -> toml::Table {
    let section: toml::Table = format!(
        r#"
topics = ["{topic}"]
brokers = "{brokers}"
group_id = "{group}"
commit_interval = "200ms"
session_timeout = "6s"
stats_interval = "1s"
"#,
        brokers = kafka::brokers()
    )
    .parse()
    .expect("kafka section");
    let mut config = base.clone();
    config.insert("kafka".into(), toml::Value::Table(section));
    config
}

/// `base` plus an `[amqp]` section for a fresh quorum queue.
pub fn with_amqp(base: &toml::Table) -> (toml::Table, AmqpSettings) {
    let settings = AmqpSettings {
        max_redeliveries: 1000,
        ..amqp::settings(QueueType::Quorum)
    };
    let mut config = base.clone();
    config.insert("amqp".into(), amqp::config_section(&settings));
    (config, settings)
}

/// The key's status, or None if it has no row.
pub async fn status(store: &Store, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM dedupq_keys WHERE tenant = $1 AND key = $2")
        .bind(TENANT)
        .bind(key)
        .fetch_optional(store.pool())
        .await
        .expect("read the key's status")
}

/// Sets `[section] key = value` in a configuration, adding what is missing.
pub fn set(config: &mut toml::Table, section: &str, key: &str, value: impl Into<toml::Value>) {
    let table = config
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("a table");
    table.insert(key.to_string(), value.into());
}
