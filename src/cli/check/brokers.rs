//! Kafka and RabbitMQ: reachable and authenticated with the configured
//! client, the topics and queues there, retention against what the topics
//! can replay.

use super::{fix_of, Check, Report};
use crate::config::{Settings, Topology};
use crate::telemetry::chain;
use crate::transport::{amqp, kafka};

pub(super) async fn check_kafka(s: &Settings, report: &mut Report) {
    let k = &s.kafka;
    if k.topics.is_empty() {
        retention(s, &[], report);
        return;
    }
    let protocol = k
        .client
        .get("security.protocol")
        .map_or("plaintext", String::as_str);
    let cluster = match kafka::cluster(k).await {
        Ok(c) => c,
        Err(e) => {
            report.push(Check::fail(
                "kafka.connect",
                format!("{} ({protocol}): {}", k.brokers, chain(&e)),
                "check kafka.brokers and, for TLS or SASL, kafka.client (security.protocol, \
                 sasl.mechanisms, sasl.username, ssl.ca.location) and kafka.client_files",
            ));
            return;
        }
    };
    report.push(Check::ok(
        "kafka.connect",
        format!(
            "{} broker(s) at {} ({protocol})",
            cluster.brokers, k.brokers
        ),
    ));
    for topic in &k.topics {
        let name = format!("kafka.topic {topic}");
        report.push(match cluster.topics.get(topic) {
            Some(partitions) => Check::ok(name, format!("{partitions} partition(s)")),
            None => Check::fail(
                name,
                "does not exist (or this principal may not describe it)",
                format!(
                    "create it (kafka-topics.sh --create --topic {topic} --partitions <n>), or \
                     grant DESCRIBE and READ on it; dedupq never creates the topics it consumes"
                ),
            ),
        });
    }
    for topic in kafka::produced_topics(k) {
        let name = format!("kafka.topic {topic}");
        report.push(match cluster.topics.get(&topic) {
            Some(partitions) => Check::ok(
                name,
                format!("{partitions} partition(s); dedupq produces dead letters or replies here"),
            ),
            None if k.create_topics => Check::warn(
                name,
                "does not exist; dedupq run creates it (kafka.create_topics = true)",
                "nothing, or create it yourself to choose its partitions and retention",
            ),
            None => Check::fail(
                name,
                "does not exist: dedupq produces dead letters or replies here and refuses to \
                 start without it",
                format!(
                    "create it (kafka-topics.sh --create --topic {topic}), or set \
                     kafka.create_topics = true"
                ),
            ),
        });
    }
    match kafka::topic_replays(k).await {
        Ok(replays) => retention(s, &replays, report),
        Err(e) => report.push(Check::fail(
            "retention.keep",
            format!("cannot read the topics' configuration: {}", chain(&e)),
            "grant DESCRIBE_CONFIGS on the topics to this principal",
        )),
    }
}

fn retention(s: &Settings, replays: &[(String, kafka::Replay)], report: &mut Report) {
    report.push(match crate::retention::resolve(s, replays) {
        Ok(keep) => {
            let how = match s.retention.keep.fixed() {
                Some(_) => "as set".to_string(),
                None if replays.is_empty() => "auto: no Kafka topic to follow".to_string(),
                None => "auto: the longest replay of the consumed topics".to_string(),
            };
            Check::ok(
                "retention.keep",
                format!(
                    "finished keys are kept {} ({how})",
                    humantime::format_duration(keep)
                ),
            )
        }
        Err(e) => Check::fail("retention.keep", e.problem.clone(), fix_of(&e)),
    });
}

pub(super) async fn check_amqp(s: &Settings, report: &mut Report) {
    let a = &s.amqp;
    if a.queues.is_empty() {
        return;
    }
    let missing = match amqp::missing_objects(a).await {
        Ok(m) => m,
        Err(e) => {
            report.push(Check::fail(
                "amqp.connect",
                chain(&e).to_string(),
                "check amqp.url (or amqp.url_file): host, port, vhost, user and password, and \
                 amqp.tls_ca_file for amqps://",
            ));
            return;
        }
    };
    report.push(Check::ok(
        "amqp.connect",
        format!("connected to {}", crate::config::redact_url(a.url.expose())),
    ));
    let objects = 2 + 2 * a.queues.len();
    report.push(match (missing.is_empty(), a.topology) {
        (true, _) => Check::ok(
            "amqp.topology",
            format!(
                "the dead-letter exchange and all {} queues exist",
                objects - 1
            ),
        ),
        (false, Topology::Declare) => Check::warn(
            "amqp.topology",
            format!("missing: {}; dedupq run declares them", missing.join(", ")),
            "nothing (amqp.topology = \"declare\")",
        ),
        (false, Topology::Verify) => Check::fail(
            "amqp.topology",
            format!("missing: {}", missing.join(", ")),
            "declare them as documented, or set amqp.topology = \"declare\"",
        ),
    });
}
