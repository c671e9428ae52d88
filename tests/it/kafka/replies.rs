use super::common::{body, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, header_str, headers, produce, Running};
use crate::support::{engine, fast_options, isolated_store, unique};
use rdkafka::message::Message;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fresh_and_stored_outcomes_are_replied_keyed_by_the_idempotency_key() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("req", 1).await;
    let replies = unique("replies");
    kafka::create_topic(&replies, 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let producer = kafka::producer();
    let mut request = headers(TENANT, "pay-7");
    request.push(("correlation-id".into(), b"c-1".to_vec()));
    produce(&producer, &topic, 0, &request, &body(7)).await;
    produce(&producer, &topic, 0, &request, &body(7)).await;

    let mut settings = kafka::settings(&topic, &group);
    settings.reply_topic = Some(replies.clone());
    let running = Running::start(settings, engine(&store, handler.clone(), fast_options()));
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    assert_eq!(handler.count(), 1);

    let got = kafka::read(&replies, 1, 2, Duration::from_secs(10)).await;
    let json = |i: usize| -> Value { serde_json::from_slice(got[i].payload().unwrap()).unwrap() };
    for m in &got {
        assert_eq!(m.key(), Some(&b"pay-7"[..]));
        assert_eq!(header_str(m, "correlation-id"), "c-1");
    }
    assert_eq!(json(0)["outcome"], "processed");
    assert_eq!(json(1)["outcome"], "duplicate");
    assert_eq!(json(0)["status"], "done");
    assert_eq!(
        json(0)["body"],
        json(1)["body"],
        "the duplicate replays the stored result"
    );
    assert_eq!(json(1)["result_status"], 201);
    running.stop().await;
}
