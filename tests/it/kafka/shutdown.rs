//! Shutdown with a batch stuck in a handler that never answers: one
//! `kafka.drain_timeout`, not one per stage.

use super::common::{body, TENANT};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

const DRAIN: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_a_batch_stuck_in_a_hanging_handler_exits_within_one_drain_timeout() {
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs {
        hang_before_charge_next: 1000,
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("stuck", 1).await;
    let group = unique("g");
    let mut base = base_config(&store_settings, &provider);
    // The handler would wait a minute for the provider: only the drain
    // bound ends the batch.
    base["handler"]["timeout"] = "60s".into();
    base["engine"]["lease"] = "90s".into();
    let config = kafka::with_kafka(
        &base,
        &topic,
        &group,
        &format!(r#"drain_timeout = "{}s""#, DRAIN.as_secs()),
    );
    let mut dedupq = Dedupq::start(&config).await;
    let producer = kafka::producer();
    produce(&producer, &topic, 0, &headers(TENANT, "hangs"), &body(1)).await;
    eventually(
        Duration::from_secs(30),
        "the handler is waiting on the provider",
        || {
            let dedupq = &dedupq;
            async move {
                let claimed = dedupq.metric(r#"dedupq_claims_total{result="won"}"#).await;
                (claimed >= 1.0).then_some(())
            }
        },
    )
    .await;

    let took = dedupq
        .terminate(DRAIN * 3)
        .await
        .unwrap_or_else(|| panic!("no exit within {:?}:\n{}", DRAIN * 3, dedupq.log_tail()));
    assert!(
        took < DRAIN + Duration::from_secs(4),
        "exit took {took:?} with drain_timeout {DRAIN:?}:\n{}",
        dedupq.log_tail()
    );
    assert!(
        took >= DRAIN - Duration::from_millis(500),
        "the batch got its drain: {took:?}"
    );
    assert_eq!(
        kafka::committed(&group, &topic, 1).await,
        vec![-1],
        "the stuck message is not committed: it comes back"
    );
}
