//! Deliveries lapin cannot parse (a non-UTF-8 `message_id` or header
//! name) break the client's whole connection before dedupq sees them.
//! The work queue's delivery limit makes RabbitMQ dead-letter them; the
//! payments around them are charged once, nothing innocent is
//! dead-lettered, and shutdown stays bounded. While sessions keep failing
//! (no limit), the queue is reported stalled.

use crate::support::amqp::{self, Client, Msg};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::rabbit_management::{close_connection, connections_named};
use crate::support::raw_amqp::{
    self, death_reason, publish_raw, take_all, FieldValue, RawDelivery, RawProperties,
};
use crate::support::{eventually, isolated_store, unique};
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use dedupq_provider::Knobs;
use std::time::Duration;
use tokio::time::Instant;

const TENANT: &str = "acme";
const DRAIN: Duration = Duration::from_secs(3);

fn payment(key: &str, n: u32) -> Msg {
    Msg::new(
        TENANT,
        key,
        &format!(r#"{{"amount": {n}, "currency": "EUR"}}"#),
    )
}

fn identity(key: &[u8]) -> Vec<(Vec<u8>, FieldValue)> {
    vec![
        (b"client-id".to_vec(), FieldValue::LongStr(TENANT.into())),
        (
            b"idempotency-key".to_vec(),
            FieldValue::LongStr(key.to_vec()),
        ),
    ]
}

fn bad_message_id() -> RawProperties {
    RawProperties {
        message_id: Some(b"\xff\xfe-poison".to_vec()),
        headers: Some(identity(b"poison-id")),
        ..RawProperties::default()
    }
}

fn bad_header_name() -> RawProperties {
    let mut headers = identity(b"poison-name");
    headers.push((b"x-\xff\xfe".to_vec(), FieldValue::LongStr(b"v".to_vec())));
    RawProperties {
        headers: Some(headers),
        ..RawProperties::default()
    }
}

async fn publish_poison(queue: &str, properties: &RawProperties) {
    publish_raw(&amqp::amqp_url(), queue, properties, br#"{"amount": 666}"#)
        .await
        .expect("raw publish");
}

/// SIGTERM returns within `amqp.drain_timeout` + 5 s.
async fn stops_within_the_drain_bound(dedupq: &mut Dedupq) {
    let stopped = dedupq
        .terminate(DRAIN + Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", dedupq.log_tail()));
    assert!(
        stopped < DRAIN + Duration::from_secs(5),
        "SIGTERM took {stopped:?}"
    );
}

fn key_of(d: &RawDelivery) -> Vec<u8> {
    match d.properties.header(b"idempotency-key") {
        Some(FieldValue::LongStr(k)) => k.clone(),
        _ => Vec::new(),
    }
}

async fn start(settings: &AmqpSettings, provider: &Provider) -> Dedupq {
    let (_, store) = isolated_store().await;
    let mut config = base_config(&store, provider);
    config.insert("amqp".into(), amqp::config_section(settings));
    let dedupq = Dedupq::start(&config).await;
    super::crash::wait_ready(&dedupq).await;
    dedupq
}

/// dedupq's connection named `name`, when exactly one is listed.
async fn listed(name: &str) -> Option<serde_json::Value> {
    let listed = connections_named(name).await;
    (listed.len() == 1).then(|| listed[0].clone())
}

/// dedupq's connection named `name`, if it is newer than `before`.
async fn reconnected(name: &str, before: &serde_json::Value) -> Option<serde_json::Value> {
    let again = listed(name).await?;
    (again["connected_at"] != before["connected_at"]).then_some(again)
}

/// Waits until the payment `key` is charged (once).
async fn until_charged(provider: &Provider, key: &str, what: &str) {
    eventually(Duration::from_secs(30), what, || async {
        (provider.charges_for(&format!("{TENANT}:{key}")).await.len() == 1).then_some(())
    })
    .await;
}

const KEYS: [&str; 5] = ["before-1", "before-2", "between", "after-1", "after-2"];

/// What became of the seven messages: the keys dead-lettered (with the
/// broker's reason) and the keys charged, and how long until each message
/// had one of the two ends.
struct Ended {
    dead: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    dead_letters: Vec<RawDelivery>,
    charged: Vec<&'static str>,
    took: Duration,
}

/// Two unreadable deliveries amid five payments, published into a running
/// `dedupq` with the default prefetch.
async fn poison_amid_payments(
    settings: &AmqpSettings,
    dedupq: &Dedupq,
    provider: &Provider,
) -> Ended {
    let queue = settings.queues[0].clone();
    let client = Client::connect().await;
    let started = Instant::now();
    client.publish(&queue, &payment(KEYS[0], 1)).await;
    client.publish(&queue, &payment(KEYS[1], 2)).await;
    publish_poison(&queue, &bad_message_id()).await;
    client.publish(&queue, &payment(KEYS[2], 3)).await;
    publish_poison(&queue, &bad_header_name()).await;
    client.publish(&queue, &payment(KEYS[3], 4)).await;
    client.publish(&queue, &payment(KEYS[4], 5)).await;
    let dlq = settings.dead_letter_queue.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (charges, dead) = (provider.stats().await.charges, client.ready(&dlq).await);
        if charges + i64::from(dead) >= 7 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s only {charges} charged and {dead} dead-lettered of 7 ({} ready in the work queue):\n{}",
            client.ready(&queue).await,
            dedupq.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    let dead_letters = take_all(&dlq).await;
    let mut dead: Vec<_> = dead_letters
        .iter()
        .map(|d| (key_of(d), death_reason(&d.properties)))
        .collect();
    dead.sort();
    let mut charged = Vec::new();
    for key in KEYS {
        let n = provider.charges_for(&format!("{TENANT}:{key}")).await.len();
        assert!(n <= 1, "{key} charged {n} times:\n{}", dedupq.log_tail());
        if n == 1 {
            charged.push(key);
        }
    }
    Ended {
        dead,
        dead_letters,
        charged,
        took,
    }
}

fn limited(cautious_acks: u32) -> AmqpSettings {
    AmqpSettings {
        delivery_limit: 2,
        cautious_acks,
        drain_timeout: DRAIN,
        prefetch: AmqpSettings::default().prefetch,
        ..amqp::settings(QueueType::Quorum)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreadable_deliveries_are_dead_lettered_by_the_delivery_limit_and_the_payments_around_them_are_charged_once(
) {
    let provider = Provider::start(Knobs::default()).await;
    let settings = limited(AmqpSettings::default().cautious_acks);
    let mut dedupq = start(&settings, &provider).await;
    let ended = poison_amid_payments(&settings, &dedupq, &provider).await;

    let limit = Some(b"delivery_limit".to_vec());
    assert_eq!(
        ended.dead,
        vec![
            (b"poison-id".to_vec(), limit.clone()),
            (b"poison-name".to_vec(), limit)
        ],
        "only the poisons are dead-lettered, by the broker's delivery limit"
    );
    let poison = ended
        .dead_letters
        .iter()
        .find(|d| key_of(d) == b"poison-id")
        .expect("the message_id poison");
    assert_eq!(
        poison.properties.message_id.as_deref(),
        Some(&b"\xff\xfe-poison"[..]),
        "the dead letter keeps its bytes"
    );
    assert_eq!(ended.charged, KEYS, "every payment charged once");
    assert!(
        ended.took < Duration::from_secs(15),
        "took {:?}",
        ended.took
    );
    eprintln!(
        "every message ended {:?} after the first publish",
        ended.took
    );
    assert!(dedupq.alive(), "{}", dedupq.log_tail());

    stops_within_the_drain_bound(&mut dedupq).await;
    let client = Client::connect().await;
    assert_eq!(
        client.ready(&settings.queues[0]).await,
        0,
        "nothing left behind"
    );
    client.cleanup(&settings).await;
}

/// The broken variant: without one-at-a-time sessions after a failure,
/// the deliveries in the poison's prefetch window are returned with it on
/// every failed session, and RabbitMQ dead-letters innocent payments.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_cautious_sessions_innocent_payments_behind_a_poison_are_dead_lettered_with_it() {
    let provider = Provider::start(Knobs::default()).await;
    let settings = limited(0);
    let dedupq = start(&settings, &provider).await;
    let ended = poison_amid_payments(&settings, &dedupq, &provider).await;

    let innocent: Vec<_> = ended
        .dead
        .iter()
        .filter(|(k, _)| !k.starts_with(b"poison"))
        .collect();
    assert!(
        !innocent.is_empty(),
        "innocent payments dead-lettered: {:?}",
        ended.dead
    );
    assert!(ended.charged.len() < KEYS.len());
    Client::connect().await.cleanup(&settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_sessions_keep_failing_the_queue_is_reported_stalled_until_they_stop_and_sigterm_stays_bounded(
) {
    let provider = Provider::start(Knobs::default()).await;
    // A classic queue has no delivery limit: nothing ends the poison but
    // an operator.
    let settings = AmqpSettings {
        stall_after: Duration::from_secs(2),
        drain_timeout: DRAIN,
        ..amqp::settings(QueueType::Classic)
    };
    let queue = settings.queues[0].clone();
    let mut dedupq = start(&settings, &provider).await;
    publish_poison(&queue, &bad_message_id()).await;

    let stalled = r#"dedupq_stalled_lanes{transport="amqp"}"#;
    let text = eventually(Duration::from_secs(30), "readyz names the queue", || {
        let (dedupq, queue) = (&dedupq, &queue);
        async move {
            let (ok, text) = dedupq.readyz().await;
            (!ok && text.contains(queue.as_str())).then_some(text)
        }
    })
    .await;
    assert!(text.contains("no RabbitMQ session has lasted"), "{text}");
    assert_eq!(dedupq.metric(stalled).await, 1.0);

    // The operator takes the poison away; the next session lasts.
    let removed = eventually(Duration::from_secs(30), "the poison taken away", || {
        let queue = queue.clone();
        async move {
            let mut raw = raw_amqp::connect(&amqp::amqp_url()).await.ok()?;
            let got = raw.get(&queue).await.ok().flatten();
            let _ = raw.close().await;
            got
        }
    })
    .await;
    assert_eq!(key_of(&removed), b"poison-id");
    let client = Client::connect().await;
    client.publish(&queue, &payment("after", 7)).await;
    eventually(Duration::from_secs(30), "ready again", || {
        let dedupq = &dedupq;
        async move { dedupq.readyz().await.0.then_some(()) }
    })
    .await;
    assert_eq!(dedupq.metric(stalled).await, 0.0);
    until_charged(&provider, "after", "the payment charged").await;
    stops_within_the_drain_bound(&mut dedupq).await;
    client.cleanup(&settings).await;
}

/// Polls `settled` (how many payments are accounted for, and where they
/// are) until it counts `expected`; after 30 s what is missing is stranded.
async fn until_settled<F, Fut>(dedupq: &Dedupq, expected: i64, mut settled: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (i64, String)>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (count, seen) = settled().await;
        if count >= expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after 30 s {seen}:\n{}",
            dedupq.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a failed session dedupq consumes one delivery at a time, then
/// cancels that consumer and consumes with the normal prefetch again. The
/// broker pushes the next delivery to the cautious consumer as soon as the
/// last one is acked, and a cancel does not give it back: unless dedupq
/// handles what the cancelled consumer holds, that payment waits, unacked,
/// until the connection closes.
///
/// One ack of caution cannot keep the poison from the normal prefetch, and
/// each session it ends there counts a delivery for every payment in
/// flight, so at the delivery limit of 2 a payment may be dead-lettered
/// beside it (with the defaults, 256 acks of caution and a limit of 20, it
/// is not). Every payment must end charged or dead-lettered; one that is
/// neither is stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaving_one_at_a_time_consumption_strands_no_delivery() {
    let provider = Provider::start(Knobs::default()).await;
    let settings = limited(1);
    let queue = settings.queues[0].clone();
    let dedupq = start(&settings, &provider).await;
    let client = Client::connect().await;
    publish_poison(&queue, &bad_message_id()).await;
    let keys: Vec<String> = (0..20).map(|i| format!("behind-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        client.publish(&queue, &payment(key, i as u32 + 1)).await;
    }
    let dlq = settings.dead_letter_queue.clone();
    // The poison ends in the dead-letter queue too.
    until_settled(&dedupq, keys.len() as i64 + 1, || async {
        let charged = provider.stats().await.charges;
        let dead = client.ready(&dlq).await;
        let ready = client.ready(&queue).await;
        let seen = format!(
            "{charged} of {} payments charged and {dead} dead-lettered with the poison \
             ({ready} ready, the rest stranded)",
            keys.len()
        );
        (charged + i64::from(dead), seen)
    })
    .await;
    for key in &keys {
        let n = provider.charges_for(&format!("{TENANT}:{key}")).await.len();
        assert!(n <= 1, "{key} charged {n} times");
    }
    client.cleanup(&settings).await;
}

/// The same switch after a session the broker ended (no poison to end a
/// later one): a delivery the cautious consumer held at its cancel and did
/// not handle would stay unacked on the live channel for good. Whether the
/// broker pushed one before the cancel is a race, so the switch is made
/// several times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaving_one_at_a_time_consumption_after_a_closed_session_strands_no_delivery() {
    let provider = Provider::start(Knobs::default()).await;
    let connection_name = unique("dedupq-caution");
    let settings = AmqpSettings {
        connection_name: connection_name.clone(),
        delivery_limit: 10,
        ..limited(1)
    };
    let queue = settings.queues[0].clone();
    let dedupq = start(&settings, &provider).await;
    let client = Client::connect().await;
    let mut charged_before = 0;
    for round in 0..8 {
        let open = eventually(
            Duration::from_secs(20),
            "dedupq's connection is listed",
            || listed(&connection_name),
        )
        .await;
        close_connection(&open).await;
        eventually(Duration::from_secs(20), "dedupq connects again", || {
            reconnected(&connection_name, &open)
        })
        .await;
        let keys: Vec<String> = (0..10).map(|i| format!("round-{round}-{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            client.publish(&queue, &payment(key, i as u32 + 1)).await;
        }
        until_settled(&dedupq, keys.len() as i64, || async {
            let charged = provider.stats().await.charges - charged_before;
            let ready = client.ready(&queue).await;
            let seen = format!(
                "round {round}: only {charged} of {} payments charged ({ready} ready, the rest stranded)",
                keys.len()
            );
            (charged, seen)
        })
        .await;
        for key in &keys {
            let n = provider.charges_for(&format!("{TENANT}:{key}")).await.len();
            assert_eq!(n, 1, "{key} charged {n} times");
        }
        charged_before = provider.stats().await.charges;
    }
    assert!(
        dedupq
            .log_tail()
            .contains("consuming with the normal prefetch again"),
        "the switch happened:\n{}",
        dedupq.log_tail()
    );
    client.cleanup(&settings).await;
}

/// A connection lost while a cautious session (one delivery at a time,
/// after a failed one) waits for its batch before leaving caution: the
/// session ends within `amqp.drain_timeout`, as any other, and dedupq
/// connects again. Waiting for the batch instead held the queue for as long
/// as its handler ran, and for good when the batch's ack never resolved on
/// the dead connection (seen once in a hostile chaos run: a queue stalled
/// with one delivery in hand, no session for 100 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_lost_while_a_cautious_session_waits_for_a_handler_ends_within_the_drain_bound(
) {
    const SLOW: Duration = Duration::from_secs(25);
    let provider = Provider::start(Knobs {
        slow_after_charge: SLOW,
        ..Knobs::default()
    })
    .await;
    let connection_name = unique("dedupq-caution-lost");
    let settings = AmqpSettings {
        connection_name: connection_name.clone(),
        delivery_limit: 10,
        // The copy that comes back waits out the lost batch's lease.
        retry_delay_max: Duration::from_secs(5),
        ..limited(1)
    };
    let queue = settings.queues[0].clone();
    let (_, store) = isolated_store().await;
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    // One try of the handler outlasts the session's drain.
    config["engine"]["lease"] = "30s".into();
    config["handler"]["timeout"] = "20s".into();
    let dedupq = Dedupq::start(&config).await;
    super::crash::wait_ready(&dedupq).await;
    let client = Client::connect().await;

    // A failed session: the next one consumes one delivery at a time.
    let first = eventually(Duration::from_secs(20), "dedupq connects", || {
        listed(&connection_name)
    })
    .await;
    close_connection(&first).await;
    let cautious = eventually(Duration::from_secs(20), "dedupq connects again", || {
        reconnected(&connection_name, &first)
    })
    .await;

    // One ack of caution...
    client.publish(&queue, &payment("fast", 1)).await;
    until_charged(&provider, "fast", "the first payment charged").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // ...then a payment whose provider answers after SLOW: the session
    // waits for its handler before it consumes with the normal prefetch.
    provider
        .set_knobs(serde_json::json!({ "slow_after_charge_next": 1 }))
        .await;
    client.publish(&queue, &payment("slow", 2)).await;
    until_charged(&provider, "slow", "the slow payment charged").await;

    close_connection(&cautious).await;
    let lost = Instant::now();
    let bound = DRAIN + Duration::from_secs(5);
    loop {
        if reconnected(&connection_name, &cautious).await.is_some() {
            break;
        }
        assert!(
            lost.elapsed() < bound,
            "no new session {bound:?} after the connection was lost (the provider answers after {SLOW:?}):\n{}",
            dedupq.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("connected again {:?} after the loss", lost.elapsed());

    // The slow payment comes back; once its lease is over it is taken over,
    // and the retry with its derived key stores the provider's one charge.
    let stored =
        |outcome: &str| format!(r#"dedupq_messages_total{{transport="amqp",outcome="{outcome}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let processed = dedupq.metric(&stored("processed")).await;
        let taken_over = dedupq.metric(&stored("takeover")).await;
        if processed + taken_over >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow payment has no outcome 90 s after the loss:\n{}",
            dedupq.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        provider.charges_for(&format!("{TENANT}:slow")).await.len(),
        1
    );
    assert_eq!(provider.stats().await.charges, 2, "one charge each");
    client.cleanup(&settings).await;
}
