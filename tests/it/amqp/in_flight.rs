use super::Harness;
use crate::support;
use crate::support::amqp::{self, Msg};
use crate::support::handlers::Recording;
use crate::support::pg_faults::read_status;
use dedupq::transport::amqp::QueueType;
use std::time::Duration;

const BODY: &str = r#"{"amount": 700, "currency": "EUR"}"#;

/// Publishes the first copy, waits until its handler is running, then
/// publishes the second.
async fn second_copy_while_the_first_runs(h: &Harness, first: Msg, second: Msg) {
    h.client.publish(h.queue(), &first).await;
    let handler = h.handler.clone();
    support::eventually(Duration::from_secs(10), "the first handler runs", || {
        let started = handler.count() == 1;
        async move { started.then_some(()) }
    })
    .await;
    h.client.publish(h.queue(), &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_delivery_while_the_first_handler_runs_goes_through_the_delay_queue_then_is_a_duplicate(
) {
    let handler = Recording::with_delay(Duration::from_millis(1500));
    let h = Harness::start(QueueType::Quorum, handler).await;
    let replies = h.client.reply_queue().await;
    let msg = |c: &str| Msg::new("acme", "pay-slow", BODY).reply_to(&replies, c);

    second_copy_while_the_first_runs(&h, msg("first"), msg("second")).await;
    let got = h
        .client
        .expect_exactly(&replies, 2, Duration::from_secs(20))
        .await;

    assert_eq!(h.handler.count(), 1, "one effect");
    let second = got
        .iter()
        .find(|g| g.correlation_id.as_deref() == Some("second"))
        .expect("a reply to the second copy");
    assert_eq!(
        second.header("dedupq-outcome").as_deref(),
        Some("duplicate")
    );
    assert_eq!(second.json()["outcome"], "duplicate");
    assert_eq!(
        second.json()["body"],
        got[0].json()["body"],
        "the stored result is replayed"
    );
    // The second copy waited in the delay queue at least once; escalating
    // delays (50 ms doubling) bound its trips over the 1.5 s the first ran.
    // A requeue loop would spin hundreds of times here.
    let trips = h.decided("in_flight");
    assert!(
        (1..=8).contains(&trips),
        "{trips} trips through the delay queue"
    );
    assert_eq!(h.decided("duplicate"), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_past_the_redelivery_cap_is_dead_lettered_with_reason_retry_limit() {
    let settings = dedupq::transport::amqp::AmqpSettings {
        max_redeliveries: 2,
        ..amqp::settings(QueueType::Classic)
    };
    let h = Harness::start_with(settings, Recording::with_delay(Duration::from_secs(3))).await;
    let msg = Msg::new("acme", "pay-capped", BODY);

    second_copy_while_the_first_runs(&h, msg.clone(), msg).await;
    let dead = h
        .client
        .expect_exactly(&h.settings.dead_letter_queue, 1, Duration::from_secs(10))
        .await;

    assert_eq!(
        dead[0].header("dedupq-reason").as_deref(),
        Some("retry_limit")
    );
    assert_eq!(dead[0].header("dedupq-trips").as_deref(), Some("2"));
    assert_eq!(dead[0].header("dedupq-key").as_deref(), Some("pay-capped"));
    assert_eq!(dead[0].header("dedupq-tenant").as_deref(), Some("acme"));
    assert_eq!(dead[0].json()["amount"], 700, "the original body is kept");
    assert_eq!(h.decided("in_flight"), 3, "first try and exactly two trips");
    let handler = h.handler.clone();
    let store = h.store.clone();
    support::eventually(Duration::from_secs(10), "the first copy finishes", || {
        let store = store.clone();
        async move {
            let done: i64 =
                sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE status = 'done'")
                    .fetch_one(store.pool())
                    .await
                    .ok()?;
            (done == 1).then_some(())
        }
    })
    .await;
    assert_eq!(handler.count(), 1);
    h.finish().await;
}

/// A key whose worker died mid-call stays held until that worker's lease
/// ends; its delivery, back at once, waits in the delay queue meanwhile.
/// Run against `amqp.max_redeliveries` of 20 and of 3 (16.55 s and 0.35 s of
/// trips at their floor): the start-up check (`config::check`) accepts the
/// first and refuses the second against a 4 s lease, and only the first
/// is still travelling when the lease ends.
async fn a_dead_workers_key(max_redeliveries: u32) -> DeadWorkersKey {
    const LEASE: Duration = Duration::from_secs(4);
    let amqp = dedupq::transport::amqp::AmqpSettings {
        max_redeliveries,
        ..amqp::settings(QueueType::Classic)
    };
    let mut config = dedupq::config::Settings {
        amqp: amqp.clone(),
        ..Default::default()
    };
    config.engine.lease = LEASE;
    config.engine.renew_every = Duration::from_secs(1);
    config.handler.timeout = Duration::from_secs(2);
    let accepted = config.validate().map_err(|e| e.setting);

    let h = Harness::start_with(amqp, Recording::default()).await;
    let key = format!("pay-dead-{max_redeliveries}");
    let planted = support::message("acme", &key, BODY);
    let parsed = dedupq::engine::Parser::new(&Default::default())
        .parse(&planted)
        .unwrap();
    h.store
        .claim_batch(
            &[support::claim_request(&parsed, &planted)],
            "a-worker-that-died",
            LEASE,
        )
        .await
        .unwrap();
    h.client
        .publish(h.queue(), &Msg::new("acme", &key, BODY))
        .await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut dead = Vec::new();
    let status = loop {
        dead.extend(h.client.drain(&h.settings.dead_letter_queue).await);
        let status = read_status(h.store.pool(), "acme", &key)
            .await
            .expect("the key's row");
        if status == "done" || !dead.is_empty() {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key settles within 20 s: still {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let charges = h.handler.count();
    h.finish().await;
    DeadWorkersKey {
        accepted,
        dead,
        status,
        charges,
    }
}

/// What [`a_dead_workers_key`] saw: the start-up check's verdict on its
/// settings (the setting it names), the dead letters, the key's status
/// once it settled, and the handler's runs.
struct DeadWorkersKey {
    accepted: Result<(), String>,
    dead: Vec<amqp::Got>,
    status: String,
    charges: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_left_by_a_dead_worker_is_taken_over_when_its_lease_ends() {
    let DeadWorkersKey {
        accepted,
        dead,
        status,
        charges,
    } = a_dead_workers_key(20).await;

    assert_eq!(accepted, Ok(()), "20 trips outlast the lease twice");
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");
    assert_eq!(status, "done");
    assert_eq!(charges, 1, "taken over and run once");
}

/// The settings the start-up check refuses lose the delivery to the
/// dead-letter queue while the key is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_delay_queue_settings_refused_at_start_up_dead_letter_a_dead_workers_delivery() {
    let DeadWorkersKey {
        accepted,
        dead,
        status,
        charges,
    } = a_dead_workers_key(3).await;

    assert_eq!(accepted, Err("amqp.max_redeliveries".to_string()));
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("dedupq-reason").as_deref(),
        Some("retry_limit")
    );
    assert_eq!(status, "in_progress", "the key is still the dead worker's");
    assert_eq!(charges, 0);
}
