//! A dead letter the broker refuses for want of a permission (`write` on
//! the dead-letter exchange: a permission change, a user rotated without
//! it) is neither lost nor in the way: the message waits in the delay
//! queue and is dead-lettered again when it comes back; the payments
//! behind it are charged and answered, on the same connection; once the
//! permission is granted the dead letter lands, without a restart.
//!
//! Before, the refusal (which closes the publishing channel) ended the
//! session: the message came back first in the queue, was refused again,
//! one session after another, and the queue behind it waited.

use super::Harness;
use crate::support::amqp::Msg;
use crate::support::handlers::Recording;
use crate::support::rabbit_management::{
    connections_named, delete_user, put_permissions, put_user,
};
use crate::support::{amqp, eventually, unique};
use dedupq::config::SecretUrl;
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_refused_for_want_of_write_permission_lands_once_it_is_granted() {
    let user = unique("dqt_refused");
    put_user(&user, "refused-pw").await;
    let base = amqp::settings(QueueType::Quorum);
    // Declaring the work queue needs `write` on its dead-letter exchange:
    // granted for the start, taken away once dedupq consumes.
    put_permissions(&user, ".*", ".*", ".*").await;
    let no_dead_letters = format!("^(?!{}$).*", base.dead_letter_exchange);
    let url = amqp::amqp_url().replacen("guest:guest@", &format!("{user}:refused-pw@"), 1);
    assert_ne!(url, amqp::amqp_url(), "AMQP_URL names guest:guest");
    let connection_name = unique("dedupq-refused");
    let settings = AmqpSettings {
        url: SecretUrl::new(url),
        connection_name: connection_name.clone(),
        ..base
    };
    let h = Harness::start_with(settings, Recording::default()).await;
    let q = h.queue().to_string();
    // Everything but publishing to the dead-letter exchange.
    put_permissions(&user, ".*", &no_dead_letters, ".*").await;
    let connected_at = |listed: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        listed.iter().map(|c| c["connected_at"].clone()).collect()
    };
    // The management API lists a connection once its statistics arrive.
    let before = eventually(Duration::from_secs(20), "the connection listed", || async {
        let listed = connections_named(&connection_name).await;
        (!listed.is_empty()).then_some(connected_at(listed))
    })
    .await;

    h.client
        .publish(&q, &Msg::new("acme", "bad-json", "{not json"))
        .await;
    let replies = h.client.reply_queue().await;
    h.client
        .publish(
            &q,
            &Msg::new("acme", "pay-after", r#"{"amount": 5}"#).reply_to(&replies, "after"),
        )
        .await;
    // The payment is charged and answered; the poison's dead letter is
    // refused, again at each return (the test's retry_delay_max is 1 s),
    // so nothing reaches the dead-letter queue.
    h.client
        .expect_exactly(&replies, 1, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.client.ready(&h.settings.dead_letter_queue).await, 0);
    assert_eq!(
        connected_at(connections_named(&connection_name).await),
        before,
        "one connection throughout: the refusals ended no session"
    );

    let dead_lettered = || {
        h.engine
            .metrics()
            .dead_letters
            .with_label_values(&["not_json"])
            .get()
    };
    let failed = h
        .engine
        .metrics()
        .dead_letters_failed
        .with_label_values(&["amqp"])
        .get();
    assert!(failed >= 2, "each refusal counted ({failed})");
    assert_eq!(
        dead_lettered(),
        0,
        "a parked dead letter is not counted as dead-lettered"
    );

    put_permissions(&user, ".*", ".*", ".*").await;
    let dead = h
        .client
        .expect_exactly(&h.settings.dead_letter_queue, 1, Duration::from_secs(60))
        .await;
    assert_eq!(dead[0].header("dedupq-reason").as_deref(), Some("not_json"));
    assert_eq!(dead[0].body, b"{not json");
    assert_eq!(dead_lettered(), 1, "counted once it landed");
    eventually(Duration::from_secs(30), "the work queue empty", || async {
        (h.client.ready(&q).await == 0).then_some(())
    })
    .await;
    assert_eq!(h.handler.count(), 1, "the payment ran once");
    h.finish().await;
    delete_user(&user).await;
}
