//! Fact (e): work queues that already exist (declared by today's dedupq,
//! quorum with no limit) cannot be given the limit by declaring them again:
//! RabbitMQ answers `406 PRECONDITION_FAILED - inequivalent arg
//! 'x-delivery-limit' … current is none` (the same for
//! `x-dead-letter-exchange`, `x-dead-letter-strategy` and `x-overflow`)
//! and closes the channel. A policy can: `delivery-limit`,
//! `dead-letter-exchange`, `dead-letter-strategy = at-least-once` and
//! `overflow = reject-publish` in a policy's definition apply to the
//! existing queue at once, with the same dead-lettering as the arguments.
//! (Only one policy, the one of highest priority, applies to a queue.)

use super::raw_amqp_publish::hostile_properties;
use super::topology::{consume_session, death_reason, is_parsing_error, limit_arguments, Limited};
use crate::support::amqp::{amqp_url, Client};
use crate::support::rabbit_management::{delete_policy, put_policy};
use crate::support::raw_amqp::publish_raw;
use crate::support::unique;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, LongString};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn declaring_an_existing_work_queue_again_with_a_delivery_limit_is_refused() {
    let client = Client::connect().await;
    let queues = Limited::declare_without_limit(&client).await;
    let mut args = limit_arguments(3, &queues.exchange);
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    let channel = client.connection.create_channel().await.expect("channel");

    let declared = channel
        .queue_declare(
            queues.work.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await;

    let error = declared
        .expect_err("an existing queue keeps its arguments")
        .to_string();
    assert!(error.contains("PRECONDITION_FAILED"), "{error}");
    assert!(error.contains("inequivalent arg 'x-"), "{error}");
}

#[tokio::test]
async fn a_policy_gives_an_existing_work_queue_the_delivery_limit_and_its_dead_lettering() {
    let client = Client::connect().await;
    let queues = Limited::declare_without_limit(&client).await;
    let policy = unique("dqt_facts_limit");
    let limit = 2;
    put_policy(
        &policy,
        &format!("^{}$", queues.work),
        json!({
            "delivery-limit": limit,
            "dead-letter-exchange": queues.exchange,
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
            "expires": 600_000
        }),
    )
    .await;
    publish_raw(&amqp_url(), &queues.work, &hostile_properties(), b"{}")
        .await
        .expect("publish the poison");

    let mut failed = 0;
    while failed <= 10 {
        let session = consume_session(&queues.work, 1, false, Duration::from_secs(2)).await;
        match session.error {
            Some(e) if is_parsing_error(&e) => failed += 1,
            _ => break,
        }
    }
    delete_policy(&policy).await;

    assert_eq!(failed, limit as usize + 1);
    let dead = queues.dead_lettered().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        death_reason(&dead[0].properties).as_deref(),
        Some(&b"delivery_limit"[..])
    );
}
