//! A `reply_to` queue that refuses the reply (full with reject-publish, or
//! missing) is that message's problem only: the delivery is acked, the
//! failure counted, the outcome stays stored, and the session goes on.

use super::Harness;
use crate::support::amqp::{self, Msg};
use crate::support::handlers::Recording;
use crate::support::rabbit_management::connections_named;
use crate::support::{eventually, unique};
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::time::Duration;
use tokio::time::Instant;

/// A queue that refuses every publish: no room, and overflow rejects.
async fn full_queue(h: &Harness) -> String {
    let name = unique("dqt_full");
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(0));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString(LongString::from("reject-publish")),
    );
    let channel = h.client.connection.create_channel().await.expect("channel");
    channel
        .queue_declare(name.as_str().into(), QueueDeclareOptions::default(), args)
        .await
        .expect("declare the full queue");
    name
}

async fn stored_done(store: &dedupq::store::Store) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE status = 'done'")
        .fetch_one(store.pool())
        .await
        .expect("count done keys")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reply_to_that_refuses_is_acked_and_counted_and_the_session_goes_on() {
    let connection_name = unique("dedupq-replies");
    let settings = AmqpSettings {
        connection_name: connection_name.clone(),
        ..amqp::settings(QueueType::Quorum)
    };
    let h = Harness::start_with(settings, Recording::default()).await;
    let q = h.queue().to_string();
    // The management API lists a connection once its statistics arrive.
    let before = eventually(
        Duration::from_secs(20),
        "the connection is listed",
        || async {
            let listed = connections_named(&connection_name).await;
            (!listed.is_empty()).then_some(listed)
        },
    )
    .await;
    assert_eq!(before.len(), 1, "one connection: {before:?}");

    let full = full_queue(&h).await;
    let missing = unique("dqt_missing");
    let replies = h.client.reply_queue().await;
    h.client
        .publish(
            &q,
            &Msg::new("acme", "r-full", r#"{"amount": 1}"#).reply_to(&full, "c1"),
        )
        .await;
    h.client
        .publish(
            &q,
            &Msg::new("acme", "r-missing", r#"{"amount": 2}"#).reply_to(&missing, "c2"),
        )
        .await;
    let sent = Instant::now();
    h.client
        .publish(
            &q,
            &Msg::new("acme", "r-ok", r#"{"amount": 3}"#).reply_to(&replies, "c3"),
        )
        .await;
    let got = h
        .client
        .expect_exactly(&replies, 1, Duration::from_secs(10))
        .await;
    assert_eq!(got[0].correlation_id.as_deref(), Some("c3"));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "the next message waited {:?}",
        sent.elapsed()
    );

    let failed = || {
        h.engine
            .metrics()
            .replies_failed
            .with_label_values(&["amqp"])
            .get()
    };
    eventually(Duration::from_secs(10), "both refusals counted", || {
        let n = failed();
        async move { (n == 2).then_some(()) }
    })
    .await;
    assert_eq!(stored_done(&h.store).await, 3, "every outcome stored");
    assert_eq!(h.handler.count(), 3);
    assert_eq!(h.decided("processed"), 3);
    let after = connections_named(&connection_name).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(
        after[0]["connected_at"], before[0]["connected_at"],
        "the same connection: no reconnect"
    );
    assert_eq!(h.client.ready(&full).await, 0);
    h.finish().await;
}
