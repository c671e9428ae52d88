//! A partition that makes no progress while messages wait is named on
//! /readyz and counted in `dedupq_stalled_lanes`, until it moves again.

use super::common::{body, TENANT};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const STALLED: &str = r#"dedupq_stalled_lanes{transport="kafka"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_retried_in_place_is_named_on_readyz_after_stall_after_and_ready_again_once_it_moves(
) {
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    provider
        .set_knobs(json!({"answer_status": 404, "answer_status_rate": 1.0}))
        .await;
    let (topic, _) = kafka::topics("stall", 2).await;
    let group = unique("g");
    let config = kafka::with_kafka(
        &base_config(&store_settings, &provider),
        &topic,
        &group,
        r#"stall_after = "3s""#,
    );
    let dedupq = Dedupq::start(&config).await;
    let producer = kafka::producer();
    produce(&producer, &topic, 1, &headers(TENANT, "p-1"), &body(1)).await;

    let lane = format!("{topic}/1");
    let body_text = eventually(
        Duration::from_secs(30),
        "readyz names the partition",
        || {
            let (dedupq, lane) = (&dedupq, &lane);
            async move {
                let (ok, text) = dedupq.readyz().await;
                (!ok && text.contains(lane.as_str())).then_some(text)
            }
        },
    )
    .await;
    assert!(!body_text.contains(&format!("{topic}/0")), "{body_text}");
    assert_eq!(dedupq.metric(STALLED).await, 1.0);
    assert_eq!(provider.stats().await.charges, 0);

    provider.set_knobs(json!({"answer_status_rate": 0.0})).await;
    eventually(Duration::from_secs(30), "ready again", || {
        let dedupq = &dedupq;
        async move { dedupq.readyz().await.0.then_some(()) }
    })
    .await;
    assert_eq!(dedupq.metric(STALLED).await, 0.0);
    assert_eq!(
        provider.charges_for(&format!("{TENANT}:p-1")).await.len(),
        1
    );
    eventually(Duration::from_secs(30), "partition 1 committed", || async {
        (kafka::committed(&group, &topic, 2).await[1] == 1).then_some(())
    })
    .await;
}
