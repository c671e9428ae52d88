//! `dedupq dlq list|replay amqp` on a dead-letter queue that holds a
//! delivery lapin cannot parse: the non-UTF-8 poison RabbitMQ dead-letters
//! by its delivery limit. Every other dead letter is still listed and
//! replayed, and the poison is listed from its raw bytes and left where it
//! is.

use crate::support::raw_amqp::{publish_raw, take_all, FieldValue, RawProperties};
use crate::support::{self, amqp, cli, handlers::Recording};
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use std::sync::Arc;
use std::time::Duration;

/// Longer than any step of the command may take: past it, it hangs.
const HUNG: Duration = Duration::from_secs(60);

fn poison() -> RawProperties {
    RawProperties {
        message_id: Some(b"\xff\xfe-poison".to_vec()),
        delivery_mode: Some(2),
        headers: Some(vec![
            (b"client-id".to_vec(), FieldValue::LongStr(b"acme".to_vec())),
            (
                b"idempotency-key".to_vec(),
                FieldValue::LongStr(b"poison-1".to_vec()),
            ),
        ]),
        ..RawProperties::default()
    }
}

#[tokio::test]
async fn a_dead_letter_lapin_cannot_parse_is_listed_raw_and_the_others_are_still_replayed() {
    let settings = AmqpSettings {
        delivery_limit: 2,
        ..amqp::settings(QueueType::Quorum)
    };
    let (work, dlq) = (
        settings.queues[0].clone(),
        settings.dead_letter_queue.clone(),
    );
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
    publish_raw(&amqp::amqp_url(), &work, &poison(), br#"{"amount": 1}"#)
        .await
        .expect("raw publish");
    support::eventually(
        Duration::from_secs(60),
        "the poison dead-lettered by its delivery limit",
        || async { (client.ready(&dlq).await == 1).then_some(()) },
    )
    .await;
    // Only now: a session the poison breaks would return this one too, and
    // its dead letter could then be written twice.
    client
        .publish(&work, &amqp::Msg::new("acme", "k-1", "not json {"))
        .await;
    support::eventually(Duration::from_secs(30), "the other dead letter", || async {
        (client.ready(&dlq).await == 2).then_some(())
    })
    .await;
    running.stop().await.unwrap();

    let config = cli::config_file(
        &format!(
            "[amqp]\nqueues = [\"{work}\"]\nurl = \"{}\"\ndead_letter_exchange = \"{}\"\ndead_letter_queue = \"{dlq}\"\n",
            amqp::amqp_url(),
            settings.dead_letter_exchange
        )
        .parse()
        .unwrap(),
    );
    let run = |args: &[&str]| cli::run_within(&config, args, &[], HUNG).json_lines();

    let mut listed = run(&["dlq", "list", "amqp"]);
    listed.sort_by_key(|l| l["key"].as_str().map(str::to_string));
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        (&listed[0]["key"], &listed[0]["reason"]),
        (&"k-1".into(), &"not_json".into())
    );
    let poisoned = &listed[1];
    assert_eq!(poisoned["key"], "poison-1");
    assert_eq!(poisoned["tenant"], "acme");
    assert_eq!(poisoned["reason"], "delivery_limit");
    assert_eq!(poisoned["source"], work.as_str());
    let why = poisoned["unreadable"].as_str().unwrap_or_default();
    assert!(why.contains("message_id"), "{poisoned}");
    support::eventually(
        Duration::from_secs(10),
        "listing left both in place",
        || async { (client.ready(&dlq).await == 2).then_some(()) },
    )
    .await;

    let mut replayed = run(&["dlq", "replay", "amqp", "--execute"]);
    replayed.sort_by_key(|l| l["key"].as_str().map(str::to_string));
    assert_eq!(
        replayed[0]["replay"],
        format!("replayed to {work}").as_str(),
        "{replayed:?}"
    );
    let skipped = replayed[1]["replay"].as_str().unwrap_or_default();
    assert!(skipped.starts_with("skipped"), "{replayed:?}");
    support::eventually(
        Duration::from_secs(10),
        "only the readable one was replayed",
        || async {
            (client.ready(&dlq).await == 1 && client.ready(&work).await == 1).then_some(())
        },
    )
    .await;
    let left = take_all(&dlq).await;
    assert_eq!(
        left[0].properties.message_id.as_deref(),
        Some(&b"\xff\xfe-poison"[..]),
        "the poison stays, byte for byte"
    );
    client.cleanup(&settings).await;
}
