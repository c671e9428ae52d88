//! Dead letters always land: a body past `identity.max_body_bytes`, a body
//! near the broker's limit, and a dead letter the broker refuses for a
//! while. The partition moves on once the dead letter is confirmed, and
//! only then is it counted.

use super::common::{body, raw_header_str, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, Running};
use crate::support::kafka_raw::{produce_raw, read_raw};
use crate::support::{eventually, fast_options, isolated_store, unique};
use dedupq::config::IdentitySettings;
use dedupq::engine::{Engine, Parser};
use dedupq::health::Component;
use dedupq::metrics::Metrics;
use dedupq::store::Store;
use dedupq::transport::envelope::header as h;
use dedupq::transport::kafka::KafkaSettings;
use rdkafka::admin::TopicReplication;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn engine_with(store: &Store, handler: Arc<Recording>, max_body_bytes: usize) -> Engine {
    let identity = IdentitySettings {
        max_body_bytes,
        ..IdentitySettings::default()
    };
    Engine::new(
        store.clone(),
        handler,
        Parser::new(&identity),
        fast_options(),
        Metrics::new(),
        CancellationToken::new(),
    )
}

async fn produce(topic: &str, key: &str, payload: &[u8]) -> i64 {
    let headers: [(&[u8], Option<&[u8]>); 2] = [
        (b"client-id", Some(TENANT.as_bytes())),
        (b"idempotency-key", Some(key.as_bytes())),
    ];
    produce_raw(topic, Some(0), None, payload, &headers).await.1
}

fn dead_letters(engine: &Engine, reason: &str) -> u64 {
    engine
        .metrics()
        .dead_letters
        .with_label_values(&[reason])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_past_the_size_limit_is_dead_lettered_too_large_and_the_partition_moves_on() {
    let (store, _) = isolated_store().await;
    let (topic, dlq) = kafka::topics("toolarge", 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let just_under = format!(r#"{{"amount":1,"pad":"{}"}}"#, "x".repeat(1950));
    assert!(just_under.len() <= 2000);
    produce(&topic, "under", just_under.as_bytes()).await;
    let over = format!(r#"{{"amount":1,"pad":"{}"}}"#, "x".repeat(5000));
    let over_offset = produce(&topic, "over", over.as_bytes()).await;
    produce(&topic, "after", &body(3)).await;

    let engine = engine_with(&store, handler.clone(), 2000);
    let running = Running::start(kafka::settings(&topic, &group), engine.clone());
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    let dead = read_raw(&dlq, 1, 1, Duration::from_secs(10)).await;
    assert_eq!(raw_header_str(&dead[0], h::REASON), "too_large");
    assert_eq!(
        raw_header_str(&dead[0], h::SOURCE_OFFSET),
        over_offset.to_string()
    );
    assert_eq!(
        dead[0].payload.as_deref(),
        Some(over.as_bytes()),
        "small enough to keep"
    );
    assert_eq!(
        handler.count(),
        2,
        "the body just under the limit and the one after ran"
    );
    assert_eq!(dead_letters(&engine, "too_large"), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_near_the_brokers_limit_is_dead_lettered_without_its_payload_and_later_payments_run()
{
    let (store, _) = isolated_store().await;
    let (topic, dlq) = kafka::topics("huge", 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let huge = vec![b'#'; 1_000_000];
    let huge_offset = produce(&topic, "huge", &huge).await;
    for k in 0..3 {
        produce(&topic, &format!("after-{k}"), &body(k)).await;
    }

    let engine = engine_with(&store, handler.clone(), 1024 * 1024);
    let running = Running::start(kafka::settings(&topic, &group), engine.clone());
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await;
    let dead = read_raw(&dlq, 1, 1, Duration::from_secs(10)).await;
    let d = &dead[0];
    assert_eq!(raw_header_str(d, h::REASON), "not_json");
    assert_eq!(raw_header_str(d, h::SOURCE_OFFSET), huge_offset.to_string());
    assert_eq!(raw_header_str(d, h::SOURCE_PARTITION), "0");
    assert_eq!(raw_header_str(d, h::PAYLOAD_OMITTED), "1000000");
    assert_eq!(
        raw_header_str(d, h::PAYLOAD_SHA256),
        dedupq::fingerprint::hex(&Sha256::digest(&huge))
    );
    assert!(
        d.payload.as_deref().unwrap_or_default().is_empty(),
        "payload left out"
    );
    assert_eq!(
        raw_header_str(d, "idempotency-key"),
        "huge",
        "original headers kept"
    );
    assert_eq!(handler.count(), 3, "the payments behind it ran");
    running.stop().await;
}

fn admin() -> AdminClient<DefaultClientContext> {
    dedupq::broker::kafka::admin(&KafkaSettings::at(&kafka::brokers()))
        .create()
        .expect("admin client")
}

/// A dead-letter topic that refuses records over `max_bytes`.
async fn small_dlq(name: &str, max_bytes: &str) {
    let topic =
        NewTopic::new(name, 1, TopicReplication::Fixed(1)).set("max.message.bytes", max_bytes);
    for r in admin()
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create_topics")
    {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

async fn set_max_message_bytes(topic: &str, max_bytes: &str) {
    let change =
        AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", max_bytes);
    for r in admin()
        .alter_configs([&change], &AdminOptions::new())
        .await
        .expect("alter_configs")
    {
        r.unwrap_or_else(|(_, e)| panic!("altering {topic}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_the_broker_refuses_holds_its_partition_uncounted_until_it_lands() {
    let (store, _) = isolated_store().await;
    let topic = unique("refused");
    let dlq = format!("{topic}.dlq");
    kafka::create_topic(&topic, 1).await;
    small_dlq(&dlq, "2048").await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    produce(&topic, "first", &body(1)).await;
    let bad = produce(&topic, "bad", &vec![b'#'; 4000]).await;
    produce(&topic, "behind", &body(2)).await;

    let engine = engine_with(&store, handler.clone(), 1024 * 1024);
    let settings = KafkaSettings {
        stall_after: Duration::from_secs(2),
        ..kafka::settings(&topic, &group)
    };
    let running = Running::start(settings, engine.clone());
    // The broker refuses the dead letter (too large for this topic): it is
    // retried, the partition makes no progress and says so.
    let health = running.health.clone();
    let stalled = eventually(
        Duration::from_secs(30),
        "the partition is reported stalled",
        || {
            let lanes = health.stalled(Component::Kafka);
            async move { (!lanes.is_empty()).then_some(lanes) }
        },
    )
    .await;
    assert!(stalled[0].starts_with(&format!("{topic}/0")), "{stalled:?}");
    // Both payments were in the dead letter's batch: they ran and are
    // stored, but no offset past the dead letter is committed.
    assert_eq!(handler.count(), 2);
    assert_eq!(
        dead_letters(&engine, "not_json"),
        0,
        "not counted before it lands"
    );
    let committed = kafka::committed(&group, &topic, 1).await[0];
    assert!(
        committed <= bad,
        "committed {committed} past the refused dead letter at {bad}"
    );

    set_max_message_bytes(&dlq, "1048588").await;
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await;
    assert_eq!(
        dead_letters(&engine, "not_json"),
        1,
        "counted once, when confirmed"
    );
    let dead = read_raw(&dlq, 1, 1, Duration::from_secs(10)).await;
    assert_eq!(raw_header_str(&dead[0], h::SOURCE_OFFSET), bad.to_string());
    assert_eq!(handler.count(), 2, "nothing ran twice");
    running.stop().await;
}
