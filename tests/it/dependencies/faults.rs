//! A handler answer that points at dedupq's configuration (here a 404 for
//! one tenant's mistyped route) at the head of a partition. Its retries
//! back off (capped), and before the keys behind it could be purged while
//! their offsets are still uncommitted, it is dead-lettered
//! `handler_fault` with its key free: a restart charges nothing again.

use super::common::{status, KafkaRun, TENANT};
use crate::support::process::{base_config, Provider};
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_that_keeps_faulting_backs_off_and_is_dead_lettered_before_the_keys_behind_it_are_purged(
) {
    let (store, store_settings) = isolated_store().await;
    // Without idempotency: a payment run twice shows as two charges.
    let provider = Provider::start(Knobs {
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let mut base = base_config(&store_settings, &provider);
    let extra: toml::Table = format!(
        r#"
[handler]
kind = "payment"
url = "{charges}"
timeout = "2s"
retry_for = "6s"
routes = [{{ tenant = "typo", url = "{base}/chargez" }}]

[retention]
keep = "10s"
redelivery_horizon = "7s"
purge_every = "1s"
allow_shorter_than_topics = true

[amqp]
retry_delay_max = "1s"
max_redeliveries = 1
"#,
        charges = provider.charges_url(),
        base = provider.base,
    )
    .parse()
    .expect("config");
    for (section, table) in extra {
        base.insert(section, table);
    }
    let mut run = KafkaRun::start("faulting", 1, &base).await;

    run.pay(0, "typo", "pay-typo", 0).await;
    const N: usize = 4;
    for k in 1..=N {
        run.pay(0, TENANT, &format!("pay-{k}"), k).await;
    }
    run.wait_committed_to_end(Duration::from_secs(30)).await;
    let dedupq = &mut run.dedupq;
    let faults = dedupq
        .metric(r#"dedupq_handler_faults_total{reason="not_found"}"#)
        .await;
    assert!(
        (2.0..=40.0).contains(&faults),
        "the faulting message's retries back off: {faults} tries in 6 s"
    );
    assert_eq!(
        dedupq
            .metric(r#"dedupq_dead_letters_total{reason="handler_fault"}"#)
            .await,
        1.0
    );
    assert_eq!(
        status(&store, "pay-1").await.as_deref(),
        Some("done"),
        "the payments behind it ran"
    );
    // Their keys are purged (retention.keep 10 s); the offsets are
    // committed, so nothing brings them back.
    eventually(
        Duration::from_secs(30),
        "the finished keys purged",
        || async { (status(&store, "pay-1").await.is_none()).then_some(()) },
    )
    .await;
    dedupq.restart().await;
    dedupq
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("ready again");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        provider.stats().await.charges,
        N as i64,
        "each payment behind the faulting one charged once, across the purge and a restart"
    );
    dedupq.kill();
}
