use super::crash::wait_ready;
use crate::support;
use crate::support::amqp::{self, Client, Msg};
use crate::support::process::{base_config, Dedupq, Provider};
use dedupq::broker::kafka;
use dedupq::config::KafkaSettings;
use dedupq::transport::amqp::QueueType;
use dedupq_provider::Knobs;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::Duration;

const BODY: &str = r#"{"amount": 990, "currency": "EUR", "recipient": "acct-7"}"#;

fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

async fn create_topic(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = kafka::admin(&KafkaSettings::at(&brokers()))
        .create()
        .expect("Kafka admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create topic");
    for r in results {
        r.expect("topic created");
    }
}

async fn produce(topic: &str, tenant: &str, key: &str, body: &str) {
    let producer: FutureProducer = kafka::client(&KafkaSettings::at(&brokers()), "dedupq-test")
        .set("acks", "all")
        .create()
        .expect("Kafka producer");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "client-id",
            value: Some(tenant),
        })
        .insert(Header {
            key: "idempotency-key",
            value: Some(key),
        });
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(body)
        .headers(headers);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("Kafka accepted the copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_payment_via_kafka_and_via_rabbitmq_is_charged_once() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = support::isolated_store().await;
    let settings = amqp::settings(QueueType::Quorum);
    let topic = support::unique("dqt_pay");
    create_topic(&topic).await;
    create_topic(&format!("{topic}.dlq")).await;
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let kafka: toml::Table = format!(
        "topics = [\"{topic}\"]\nbrokers = \"{}\"\ngroup_id = \"{}\"\nauto_offset_reset = \"earliest\"",
        brokers(),
        support::unique("dqt_group")
    )
    .parse()
    .expect("kafka section");
    config.insert("kafka".into(), toml::Value::Table(kafka));
    let dedupq = Dedupq::start(&config).await;
    wait_ready(&dedupq).await;
    let client = Client::connect().await;

    let msg = Msg::new("acme", "pay-both", BODY);
    let via_amqp = client.publish(&settings.queues[0], &msg);
    let via_kafka = produce(&topic, "acme", "pay-both", BODY);
    tokio::join!(via_amqp, via_kafka);

    let outcome = |t: &'static str, o: &'static str| {
        format!("dedupq_messages_total{{transport=\"{t}\",outcome=\"{o}\"}}")
    };
    let decided = |t| {
        let (dedupq, p, d) = (&dedupq, outcome(t, "processed"), outcome(t, "duplicate"));
        async move { dedupq.metric(&p).await + dedupq.metric(&d).await }
    };
    support::eventually(Duration::from_secs(30), "both copies decided", || async {
        (decided("amqp").await == 1.0 && decided("kafka").await == 1.0).then_some(())
    })
    .await;

    let processed = dedupq.metric(&outcome("amqp", "processed")).await
        + dedupq.metric(&outcome("kafka", "processed")).await;
    assert_eq!(processed, 1.0, "one copy ran, the other was a duplicate");
    assert_eq!(provider.charges_for("acme:pay-both").await.len(), 1);
    assert_eq!(provider.stats().await.charges, 1, "one charge in total");
    client.cleanup(&settings).await;
}
