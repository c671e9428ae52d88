//! A key whose outcome stayed unknown through its last attempt is held:
//! a duplicate or a dead-letter replay is answered `unknown`, committed and
//! counted, and never runs it again — against a provider that forgot its
//! keys, where a re-run would charge twice. `keys settle` records what the
//! provider says (duplicates replay it); `keys release` gives the key one
//! more attempt with its first request and derived key.

use crate::support::amqp::Msg;
use crate::support::payments::{amqp::AmqpPayments, identity, KafkaPayments, Setup, WAIT};
use crate::support::process::Provider;
use crate::support::{cli, http_handler};
use dedupq::store::KeyStatus;
use dedupq_provider::{Compare, Knobs};
use rdkafka::Message;
use serde_json::Value;
use std::time::Duration;

const BODY_1: &[u8] = br#"{"amount":100,"currency":"EUR","sent_at":"10:00"}"#;
const BODY_2: &[u8] = br#"{"amount":200,"currency":"EUR","sent_at":"10:00"}"#;
/// A copy of BODY_2 re-published later: only the excluded field differs.
const BODY_2_LATER: &[u8] = br#"{"amount":200,"currency":"EUR","sent_at":"10:05"}"#;

/// A pipeline whose one allowed attempt gives up after 700 ms.
fn one_attempt(provider: &Provider) -> Setup {
    let mut setup = Setup::new(http_handler(
        &provider.charges_url(),
        Duration::from_millis(700),
    ));
    setup.max_attempts = 1;
    setup
}

/// Two payments whose only attempt charged and never answered: both held
/// unknown and dead-lettered. Then the provider forgets its keys.
async fn two_held_payments() -> (KafkaPayments, Provider) {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 2,
        compare: Compare::Bytes,
        ..Knobs::default()
    })
    .await;
    let mut setup = one_attempt(&provider);
    setup.reply_topic = true;
    let pipeline = KafkaPayments::start(setup).await;
    pipeline.send("held-1", BODY_1, &[]).await;
    pipeline.send("held-2", BODY_2, &[]).await;
    let dead = pipeline.dead_letters(2).await;
    for d in &dead {
        assert_eq!(
            crate::support::kafka::header_str(d, "dedupq-reason"),
            "outcome_unknown"
        );
    }
    for key in ["held-1", "held-2"] {
        let row = pipeline.wait_status(key, KeyStatus::Unknown).await;
        assert_eq!(row.lease_until, None, "{key} is held");
    }
    pipeline.wait_committed().await;
    assert_eq!(provider.stats().await.charges, 2);
    assert_eq!(provider.forget_keys().await, 2);
    (pipeline, provider)
}

fn reply(m: &rdkafka::message::OwnedMessage) -> Value {
    serde_json::from_slice(m.payload().unwrap_or_default()).expect("a JSON reply")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_unknown_key_is_answered_unknown_until_an_operator_settles_or_releases_it() {
    let (pipeline, provider) = two_held_payments().await;
    let config = pipeline.cli_config();

    // A producer retry and a dead-letter replay: answered, committed, counted.
    pipeline.send("held-1", BODY_1, &[]).await;
    pipeline.wait_committed().await;
    let replay = cli::run(
        &config,
        &[
            "dlq",
            "replay",
            "kafka",
            "--topic",
            &pipeline.topic,
            "--reason",
            "outcome_unknown",
            "--execute",
        ],
        &[],
    );
    assert_eq!(replay.code, 0, "{}\n{}", replay.stdout, replay.stderr);
    // Dead-lettered outcomes get no reply: these are the three answers.
    let replies = pipeline.replies(3).await;
    pipeline.wait_committed().await;
    // Replies are produced as each message is decided, not in the order
    // the messages were sent: compared as a set of answers.
    let mut late: Vec<(String, String, String)> = replies
        .iter()
        .map(|m| {
            let r = reply(m);
            (
                r["key"].as_str().unwrap_or_default().into(),
                r["outcome"].as_str().unwrap_or_default().into(),
                r["status"].as_str().unwrap_or_default().into(),
            )
        })
        .collect();
    late.sort();
    let unknown = |k: &str| (k.to_string(), "unknown".to_string(), "unknown".to_string());
    assert_eq!(
        late,
        [unknown("held-1"), unknown("held-1"), unknown("held-2")]
    );
    assert_eq!(pipeline.outcomes("unknown"), 5, "2 held + 3 answered");
    assert_eq!(provider.stats().await.charges, 2, "nothing ran again");

    // Settled from what the provider says: duplicates replay it.
    let settled = cli::run(
        &config,
        &[
            "keys",
            "settle",
            "acme",
            "held-1",
            "--done",
            "--result",
            r#"{"id":"ch_1","amount":100}"#,
            "--reason",
            "INC-9: the provider shows ch_1",
            "--actor",
            "alice",
        ],
        &[],
    );
    assert_eq!(settled.code, 0, "{}", settled.stderr);
    let uncertain: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT uncertain_since FROM dedupq_keys WHERE tenant = 'acme' AND key = 'held-1'",
    )
    .fetch_one(pipeline.store.pool())
    .await
    .unwrap();
    assert_eq!(
        uncertain, None,
        "a settled key leaves the index of uncertain keys"
    );
    pipeline.send("held-1", BODY_1, &[]).await;
    let r = reply(&pipeline.replies(4).await[3]);
    assert_eq!(
        (r["outcome"].as_str(), r["status"].as_str()),
        (Some("duplicate"), Some("done"))
    );
    assert_eq!(r["body"], serde_json::json!({"id": "ch_1", "amount": 100}));

    // Released: one more attempt, with the first request and derived key,
    // even though the copy that triggers it was re-published later.
    let released = cli::run(
        &config,
        &[
            "keys",
            "release",
            "acme",
            "held-2",
            "--reason",
            "INC-9: the provider has no charge",
            "--actor",
            "alice",
        ],
        &[],
    );
    assert_eq!(released.code, 0, "{}", released.stderr);
    pipeline.send("held-2", BODY_2_LATER, &[]).await;
    let row = pipeline.wait_status("held-2", KeyStatus::Done).await;
    let charges = provider.charges_for("acme:held-2").await;
    assert_eq!(charges.len(), 2, "the released attempt charged again");
    assert!(charges.iter().all(|c| c.request.as_bytes() == BODY_2));
    assert_eq!(row.result_status, Some(201));
    assert_eq!(provider.stats().await.charges, 3);

    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT key, action, actor FROM dedupq_key_audit ORDER BY id")
            .fetch_all(pipeline.store.pool())
            .await
            .unwrap();
    let row = |k: &str, a: &str| (k.to_string(), a.to_string(), "alice".to_string());
    assert_eq!(
        audit,
        [row("held-1", "settle_done"), row("held-2", "release")]
    );
    pipeline.stop().await;
}

/// The rule before it was fixed: an unknown outcome left the key open with
/// its lease over, so the next duplicate took it over and ran it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_left_open_to_takeover_is_caught_charging_twice() {
    let (pipeline, provider) = two_held_payments().await;
    let id = identity("held-1");
    sqlx::query("UPDATE dedupq_keys SET lease_until = now() WHERE tenant = $1 AND key = $2")
        .bind(id.tenant.as_str())
        .bind(id.key.as_str())
        .execute(pipeline.store.pool())
        .await
        .unwrap();

    pipeline.send("held-1", BODY_1, &[]).await;
    pipeline.wait_status("held-1", KeyStatus::Done).await;

    assert_eq!(
        provider.charges_for("acme:held-1").await.len(),
        2,
        "the duplicate ran the payment again"
    );
    pipeline.stop().await;
}

/// Through RabbitMQ: a duplicate of a held key is answered `unknown` on
/// its `reply_to`, acked (nothing left in the queues) and never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_rabbitmq_a_duplicate_of_a_held_key_is_acked_and_answered_unknown() {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let pipeline = AmqpPayments::start(one_attempt(&provider)).await;
    pipeline.send("held-a", BODY_1, None).await;
    let dead = pipeline.dead_letters(1).await;
    assert_eq!(
        dead[0].header("dedupq-reason").as_deref(),
        Some("outcome_unknown")
    );
    provider.forget_keys().await;

    let replies = pipeline.client.reply_queue().await;
    let duplicate = Msg::new("acme", "held-a", std::str::from_utf8(BODY_1).unwrap())
        .reply_to(&replies, "corr-1");
    pipeline.client.publish(pipeline.queue(), &duplicate).await;
    let answer = pipeline
        .client
        .expect_exactly(&replies, 1, WAIT)
        .await
        .remove(0);

    assert_eq!(answer.correlation_id.as_deref(), Some("corr-1"));
    assert_eq!(answer.json()["status"], "unknown");
    assert_eq!(pipeline.outcomes("unknown"), 2, "held, then answered");
    assert_eq!(pipeline.client.ready(pipeline.queue()).await, 0, "acked");
    assert_eq!(provider.stats().await.charges, 1, "never ran again");
    pipeline.stop().await;
}
