//! `dedupq dlq list|replay amqp` against the real broker: dead letters the
//! AMQP transport wrote, and one the broker dead-lettered itself.

use crate::support::{self, amqp, cli, handlers::Recording};
use dedupq::transport::amqp::QueueType;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use std::sync::Arc;
use std::time::Duration;

fn headers(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(k.into(), v);
    }
    t
}

fn text(s: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_vec()))
}

#[tokio::test]
async fn amqp_dead_letters_are_listed_without_loss_filtered_and_replayed_after_a_confirm() {
    let settings = amqp::settings(QueueType::Quorum);
    let work = settings.queues[0].clone();
    let dlq = settings.dead_letter_queue.clone();
    let (store, _) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    let client = amqp::Client::connect().await;
    let running = amqp::Running::start(&settings, &engine);
    support::eventually(Duration::from_secs(20), "topology declared", || async {
        running
            .health
            .get(dedupq::health::Component::Amqp)
            .filter(|up| *up)
    })
    .await;

    let channel = client.connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let publish = |queue: String, body: Vec<u8>, props: BasicProperties| {
        let channel = channel.clone();
        async move {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack());
        }
    };
    let original = headers(vec![
        ("client-id", text(b"acme")),
        ("idempotency-key", text(b"k1")),
        ("trace", text(&[0xff, 0x00, b'x'])),
        ("attempt", AMQPValue::LongLongInt(-7)),
        ("flag", AMQPValue::Boolean(true)),
        (
            "nested",
            AMQPValue::FieldTable(headers(vec![("a", AMQPValue::ShortInt(3))])),
        ),
    ]);
    let props = BasicProperties::default()
        .with_headers(original.clone())
        .with_message_id("m-1".into())
        .with_correlation_id("c-1".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    publish(work.clone(), b"not json {".to_vec(), props.clone()).await;
    let other = |tenant: &[u8], key: &[u8]| {
        BasicProperties::default().with_headers(headers(vec![
            ("client-id", text(tenant)),
            ("idempotency-key", text(key)),
        ]))
    };
    publish(work.clone(), b"[1]".to_vec(), other(b"globex", b"k2")).await;
    publish(
        work.clone(),
        br#"{"amount": 1}"#.to_vec(),
        other(b"acme", b"k3"),
    )
    .await;
    publish(
        work.clone(),
        br#"{"amount": 2}"#.to_vec(),
        other(b"acme", b"k3"),
    )
    .await;
    support::eventually(Duration::from_secs(30), "three dead letters", || async {
        (client.ready(&dlq).await == 3).then_some(())
    })
    .await;
    running.stop().await.unwrap();

    // One the broker dead-letters itself: a queue whose messages expire at
    // once into the same dead-letter exchange.
    let expiring = support::unique("dqt_expiring");
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongInt(1));
    args.insert(
        "x-dead-letter-exchange".into(),
        text(settings.dead_letter_exchange.as_bytes()),
    );
    channel
        .queue_declare(
            expiring.as_str().into(),
            QueueDeclareOptions::default(),
            args,
        )
        .await
        .unwrap();
    publish(expiring.clone(), b"late".to_vec(), other(b"initech", b"k4")).await;
    support::eventually(
        Duration::from_secs(20),
        "the broker dead-lettered it",
        || async { (client.ready(&dlq).await == 4).then_some(()) },
    )
    .await;

    let text_config = format!(
        "[amqp]\nqueues = [\"{work}\"]\nurl = \"{}\"\ndead_letter_exchange = \"{}\"\ndead_letter_queue = \"{dlq}\"\n",
        amqp::amqp_url(),
        settings.dead_letter_exchange
    );
    let config = cli::config_file(&text_config.parse().unwrap());
    let list = |extra: &[&str]| {
        cli::run(
            &config,
            &[&["dlq", "list", "amqp"][..], extra].concat(),
            &[],
        )
        .json_lines()
    };

    let all = list(&[]);
    assert_eq!(all.len(), 4, "{all:?}");
    let mut reasons: Vec<&str> = all.iter().map(|l| l["reason"].as_str().unwrap()).collect();
    reasons.sort();
    assert_eq!(reasons, ["conflict", "expired", "not_json", "not_json"]);
    support::eventually(
        Duration::from_secs(10),
        "listing left every dead letter in place",
        || async { (client.ready(&dlq).await == 4).then_some(()) },
    )
    .await;
    assert_eq!(
        list(&[]).len(),
        4,
        "and a second listing sees them all again"
    );

    let expired = list(&["--reason", "expired"]);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0]["source"], expiring.as_str(), "the x-death queue");
    assert_eq!(expired[0]["tenant"], "initech");
    assert_eq!(list(&["--tenant", "globex"]).len(), 1);
    assert_eq!(list(&["--reason", "not_json", "--tenant", "acme"]).len(), 1);
    assert_eq!(list(&["--since", "10m"]).len(), 4);
    assert!(list(&["--until", "2020-01-01T00:00:00Z"]).is_empty());

    let wanted = ["--reason", "not_json", "--tenant", "acme"];
    let dry = cli::run(
        &config,
        &[&["dlq", "replay", "amqp"][..], &wanted].concat(),
        &[],
    )
    .json_lines();
    assert_eq!(dry.len(), 1);
    assert_eq!(dry[0]["replay"], format!("would replay to {work}").as_str());
    support::eventually(
        Duration::from_secs(10),
        "a dry run moved nothing",
        || async {
            (client.ready(&dlq).await == 4 && client.ready(&work).await == 0).then_some(())
        },
    )
    .await;

    let done = cli::run(
        &config,
        &[&["dlq", "replay", "amqp", "--execute"][..], &wanted].concat(),
        &[],
    )
    .json_lines();
    assert_eq!(
        done[0]["replay"],
        format!("replayed to {work}").as_str(),
        "{done:?}"
    );
    support::eventually(
        Duration::from_secs(10),
        "only the replayed one left the DLQ",
        || async {
            (client.ready(&dlq).await == 3 && client.ready(&work).await == 1).then_some(())
        },
    )
    .await;
    let got = channel
        .basic_get(work.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("the replayed message");
    let d = &got.delivery;
    assert_eq!(d.data, b"not json {");
    // A quorum queue stamps x-delivery-count on every delivery, this read included.
    let mut read_back = d
        .properties
        .headers()
        .clone()
        .unwrap_or_default()
        .inner()
        .clone();
    read_back.remove("x-delivery-count");
    assert_eq!(
        FieldTable::from(read_back),
        original,
        "the original headers exactly"
    );
    assert_eq!(d.properties.message_id(), props.message_id());
    assert_eq!(d.properties.correlation_id(), props.correlation_id());
    assert_eq!(d.properties.content_type(), props.content_type());
    d.acker.ack(BasicAckOptions::default()).await.unwrap();

    // A replay the broker cannot route (its source queue is gone) is not
    // confirmed as delivered, so the dead letter stays.
    channel
        .queue_delete(expiring.as_str().into(), Default::default())
        .await
        .unwrap();
    let lost = cli::run(
        &config,
        &["dlq", "replay", "amqp", "--execute", "--reason", "expired"],
        &[],
    )
    .json_lines();
    assert!(
        lost[0]["replay"].as_str().unwrap().starts_with("failed"),
        "{lost:?}"
    );
    support::eventually(
        Duration::from_secs(10),
        "the unroutable one stayed",
        || async { (client.ready(&dlq).await == 3).then_some(()) },
    )
    .await;
    client.cleanup(&settings).await;
}
