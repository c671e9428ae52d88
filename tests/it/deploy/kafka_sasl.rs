//! Kafka over SASL_SSL (TLS with CA verification, SCRAM-SHA-512), as on
//! managed Kafka: the real `dedupq run` consumes, dead-letters and replies
//! through the broker's second listener; compressed topics are read.

use crate::support::endpoints::{endpoints, Endpoints};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self, kafka, unique};
use dedupq_provider::Knobs;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::Duration;

/// Creates `name` over SASL_SSL; `zstd` makes the broker store it zstd
/// compressed, whatever the producer sent.
async fn create_topic(ep: &Endpoints, name: &str, zstd: bool) {
    let admin: AdminClient<DefaultClientContext> =
        ep.kafka_config(&ep.ca()).create().expect("admin client");
    let mut topic = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    if zstd {
        topic = topic.set("compression.type", "zstd");
    }
    for r in admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create_topics over SASL_SSL")
    {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

fn producer(ep: &Endpoints, codec: &str) -> FutureProducer {
    ep.kafka_config(&ep.ca())
        .set("compression.type", codec)
        .set("acks", "all")
        .create()
        .unwrap_or_else(|e| panic!("a {codec} producer: {e}"))
}

async fn produce(p: &FutureProducer, topic: &str, tenant: &str, key: Option<&str>, body: &str) {
    let mut headers = OwnedHeaders::new().insert(Header {
        key: "client-id",
        value: Some(tenant),
    });
    if let Some(key) = key {
        headers = headers.insert(Header {
            key: "idempotency-key",
            value: Some(key),
        });
    }
    let record: FutureRecord<'_, str, str> = FutureRecord::to(topic).payload(body).headers(headers);
    p.send(record, Duration::from_secs(15))
        .await
        .unwrap_or_else(|(e, _)| panic!("produce over SASL_SSL: {e}"));
}

/// Reads `count` records of `topic` from the start, over SASL_SSL.
async fn read(ep: &Endpoints, topic: &str, count: usize) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = ep
        .kafka_config(&ep.ca())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader over SASL_SSL");
    kafka::read_with(consumer, topic, 1, count, Duration::from_secs(60)).await
}

#[tokio::test]
async fn dedupq_consumes_dead_letters_and_replies_over_sasl_ssl_from_a_zstd_topic() {
    let ep = endpoints();
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = support::isolated_store().await;
    let topic = unique("sasl");
    let (dlq, replies) = (format!("{topic}.dlq"), format!("{topic}.replies"));
    create_topic(&ep, &topic, true).await;
    create_topic(&ep, &dlq, false).await;
    create_topic(&ep, &replies, false).await;

    let mut config = base_config(&store, &provider);
    let kafka = format!(
        r#"
topics = ["{topic}"]
brokers = "{brokers}"
group_id = "{group}"
reply_topic = "{replies}"
commit_interval = "200ms"
session_timeout = "6s"
[client]
[client_files]
"sasl.password" = "{password_file}"
"#,
        brokers = ep.get("KAFKA_SASL_BROKERS"),
        group = unique("sasl_group"),
        password_file = ep.get("KAFKA_SASL_PASSWORD_FILE"),
    );
    let mut kafka: toml::Table = kafka.parse().unwrap();
    let client = toml::Value::try_from(ep.kafka_client(&ep.ca())).unwrap();
    kafka.insert("client".into(), client);
    config.insert("kafka".into(), toml::Value::Table(kafka));
    let mut dedupq = Dedupq::launch(&config, &[]);
    dedupq
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("dedupq ready over SASL_SSL");

    // One payment sent twice (zstd, then lz4), one more (snappy), and one
    // without a key (gzip): every codec librdkafka was built with.
    let sends = [
        ("zstd", Some("pay-1"), r#"{"amount":100}"#),
        ("lz4", Some("pay-1"), r#"{"amount":100}"#),
        ("snappy", Some("pay-2"), r#"{"amount":7}"#),
        ("gzip", None, r#"{"amount":1}"#),
    ];
    for (codec, key, body) in sends {
        produce(&producer(&ep, codec), &topic, "acme", key, body).await;
    }

    let got = read(&ep, &replies, 3).await;
    let mut outcomes: Vec<String> = got
        .iter()
        .map(|m| kafka::header_str(m, "dedupq-outcome"))
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "processed", "processed"]);
    let dead = read(&ep, &dlq, 1).await;
    assert_eq!(dead[0].payload(), Some(&br#"{"amount":1}"#[..]));
    assert!(!kafka::header_str(&dead[0], "dedupq-reason").is_empty());
    assert_eq!(provider.charges_for("acme:pay-1").await.len(), 1);
    assert_eq!(provider.charges_for("acme:pay-2").await.len(), 1);

    let log = dedupq.log();
    dedupq.kill();
    assert!(
        !log.contains(&ep.kafka_password()),
        "the SASL password reached the log:\n{log}"
    );
}

#[tokio::test]
async fn a_broker_certificate_the_configured_ca_did_not_sign_is_refused() {
    let ep = endpoints();
    let metadata = |config: rdkafka::ClientConfig| {
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().expect("client");
            consumer
                .fetch_metadata(None, Duration::from_secs(5))
                .map(|m| m.brokers().len())
        })
    };
    let trusted = metadata(ep.kafka_config(&ep.ca())).await.unwrap();
    assert_eq!(trusted.ok(), Some(1), "the generated CA is trusted");

    let other = metadata(ep.kafka_config(&ep.other_ca())).await.unwrap();
    assert!(
        other.is_err(),
        "a server certificate from another CA must be refused"
    );

    let mut wrong_password = ep.kafka_config(&ep.ca());
    wrong_password.set("sasl.password", "not-the-password");
    assert!(metadata(wrong_password).await.unwrap().is_err());
}
