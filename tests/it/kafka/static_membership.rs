//! Static group membership: `group.instance.id`, set through
//! `[kafka.client]`, names a consumer across restarts. Two processes given
//! the same one fence each other; the fenced one must not stay up as a
//! member in name only.

use super::common::{body, TENANT};
use crate::support::kafka;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

/// Before the fix, the fenced process stayed up, its consumer in
/// librdkafka's fatal state: it never consumed or committed again, and
/// once the other process stopped, nothing consumed the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_fenced_by_another_with_its_group_instance_id_stops_and_names_the_setting() {
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(20),
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("static", 2).await;
    let group = unique("g");
    let config = kafka::with_kafka(&base_config(&store_settings, &provider), &topic, &group, "");
    let instance = unique("pod");
    let env = [(
        "DEDUPQ__KAFKA__CLIENT__GROUP_INSTANCE_ID",
        instance.as_str(),
    )];
    let mut a = Dedupq::launch(&config, &env);
    a.wait_ready(Duration::from_secs(60))
        .await
        .expect("a ready");

    // Payments keep coming while the second process joins, so that the
    // fenced one has batches in flight.
    const N: usize = 120;
    let feed = kafka::paced_payments(&topic, 2, TENANT, N, Duration::from_millis(20), body);
    eventually(
        Duration::from_secs(60),
        "the first process charging",
        || async { (provider.stats().await.charges >= 10).then_some(()) },
    )
    .await;
    let mut b = Dedupq::launch(&config, &env);
    b.wait_ready(Duration::from_secs(60))
        .await
        .expect("b ready");

    let status = a.wait_exit(Duration::from_secs(60)).await;
    assert!(!status.success(), "the fenced process fails: {status}");
    let log = a.log();
    assert!(
        log.contains("kafka.client.group.instance.id") && log.contains(&instance),
        "the error names the setting and its value:\n{}",
        a.log_tail()
    );
    feed.await.expect("producer task");

    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(90)).await;
    provider.charged_once_each(N).await;
    assert!(
        b.alive(),
        "the process that joined goes on:\n{}",
        b.log_tail()
    );
}
