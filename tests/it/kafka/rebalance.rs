use super::common::{body, effects, outcomes, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, headers, produce, Running};
use crate::support::{engine, eventually, fast_options, isolated_store, unique};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_joining_mid_stream_takes_partitions_without_losing_or_repeating_work() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("rebal", 4).await;
    let group = unique("g");
    // Slow enough that batches are in flight when partitions move.
    let handler = Arc::new(Recording::with_delay(Duration::from_millis(40)));
    let e1 = engine(&store, handler.clone(), fast_options());
    let e2 = engine(&store, handler.clone(), fast_options());
    let mut settings = kafka::settings(&topic, &group);
    settings.batch_size = 10;
    let a = Running::start(settings.clone(), e1.clone());

    // At least N messages, and on until the second member has processed
    // some: however long its join takes on a busy machine, partitions move
    // mid-stream.
    const N: usize = 200;
    let producer = kafka::producer();
    let joined = e2.clone();
    let feed = {
        let (producer, topic) = (producer.clone(), topic.clone());
        tokio::spawn(async move {
            let mut k = 0;
            while k < N || (outcomes(&joined, "processed") == 0 && k < 20 * N) {
                let p = (k % 4) as i32;
                produce(
                    &producer,
                    &topic,
                    p,
                    &headers(TENANT, &format!("k{k}")),
                    &body(k),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                k += 1;
            }
            k
        })
    };
    eventually(Duration::from_secs(30), "first member busy", || async {
        (handler.count() >= 20).then_some(())
    })
    .await;
    let b = Running::start(settings, e2.clone());
    let sent = feed.await.unwrap();

    kafka::wait_committed_to_end(&group, &topic, 4, Duration::from_secs(60)).await;
    let (keys, calls) = effects(&handler.calls());
    assert_eq!((keys, calls), (sent, sent), "every message ran once");
    assert!(
        outcomes(&e2, "processed") > 0,
        "the second member took partitions"
    );
    let duplicates = outcomes(&e1, "duplicate") + outcomes(&e2, "duplicate");
    assert_eq!(
        duplicates, 0,
        "work done before the revoke was committed, not redone"
    );
    a.stop().await;
    b.stop().await;
}
