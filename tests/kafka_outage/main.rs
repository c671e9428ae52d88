//! PostgreSQL stopped for 10 seconds under a live Kafka stream. Its own
//! binary because it stops the shared PostgreSQL: scripts/test runs it
//! after the others, alone.

// Helpers are pub for their sibling modules; a test binary has no API.
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use support::handlers::Recording;
use support::kafka::{self, headers, produce, Running};
use support::outage::Stopped;
use support::{engine, eventually, fast_options, isolated_store, unique};
use tokio::time::Instant;

const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stopped_for_ten_seconds_mid_stream_commits_nothing_loses_nothing_and_resumes() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("outage", 2).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let e = engine(&store, handler.clone(), fast_options());
    let running = Running::start(kafka::settings(&topic, &group), e.clone());

    // A steady stream across the outage: ~20 s at 20 messages/s.
    const N: usize = 400;
    let feed = {
        let topic = topic.clone();
        tokio::spawn(async move {
            let producer = kafka::producer();
            for k in 0..N {
                let body = format!(r#"{{"amount":{k},"currency":"EUR"}}"#);
                produce(
                    &producer,
                    &topic,
                    (k % 2) as i32,
                    &headers("t1", &format!("k{k}")),
                    body.as_bytes(),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    eventually(Duration::from_secs(30), "stream flowing", || async {
        (handler.count() >= 40).then_some(())
    })
    .await;

    let stopped = Stopped::new("postgres");
    let errors_before = e.metrics().store_errors_total();
    eventually(
        Duration::from_secs(10),
        "engine sees the outage",
        || async { (e.metrics().store_errors_total() > errors_before).then_some(()) },
    )
    .await;
    // Outcomes stored just before the stop may still be committing; wait
    // until the committed offsets settle (2 s without change).
    let mut last = kafka::committed(&group, &topic, 2).await;
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = kafka::committed(&group, &topic, 2).await;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    let frozen = last;
    let outage_end = Instant::now() + OUTAGE - Duration::from_secs(3);
    while Instant::now() < outage_end {
        assert_eq!(
            kafka::committed(&group, &topic, 2).await,
            frozen,
            "an offset was committed while PostgreSQL was down"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let end_during = kafka::end_offsets(&topic, 2).await;
    assert!(
        frozen.iter().zip(&end_during).any(|(c, e)| c < e),
        "messages arrived during the outage and stayed uncommitted"
    );
    drop(stopped);

    feed.await.expect("producer task");
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(60)).await;
    let keys: BTreeSet<String> = handler.calls().into_iter().map(|c| c.derived_key).collect();
    assert_eq!(keys.len(), N, "every message processed after the outage");
    assert_eq!(support::count_rows(&store).await, N as i64);
    running.stop().await;
}
