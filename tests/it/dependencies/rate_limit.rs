//! The provider rate-limits: every request is answered `429 Too Many
//! Requests` with `Retry-After: 8`, nothing charged, while payments keep
//! arriving. dedupq waits as long as it was asked: intake pauses at the
//! first 429, and no request reaches the provider before its time is up
//! (not even a probe); the wait uses up no attempt and does not count
//! against `handler.retry_for`; nothing is stored failed or
//! dead-lettered; once the limit is lifted, each payment is charged once.

use super::common::{calls, set, Run, Transport};
use crate::support::process::{base_config, Provider};
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

/// What the provider asks for, in seconds: longer than the test's
/// `handler.retry_for` and far longer than its retry backoff (50–500 ms).
const RETRY_AFTER: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_payments_met_by_a_rate_limit_wait_as_long_as_the_provider_asks_and_are_charged_once_after(
) {
    payments_met_by_a_rate_limit(Transport::Kafka).await;
}

/// On RabbitMQ the deliveries are held unacked while intake waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_payments_met_by_a_rate_limit_wait_as_long_as_the_provider_asks_and_are_charged_once_after(
) {
    payments_met_by_a_rate_limit(Transport::Amqp).await;
}

async fn payments_met_by_a_rate_limit(transport: Transport) {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let mut base = base_config(&store_settings, &provider);
    set(&mut base, "handler", "retry_for", "4s");
    let mut run = Run::start(transport, "ratelimit", &base).await;

    provider
        .set_knobs(json!({
            "answer_status": 429,
            "answer_status_rate": 1.0,
            "answer_retry_after": RETRY_AFTER
        }))
        .await;
    const N: usize = 10;
    for k in 0..N {
        run.pay(k).await;
    }
    let dedupq = run.dedupq();
    eventually(Duration::from_secs(20), "intake paused", || async {
        (dedupq.metric("dedupq_handler_paused").await == 1.0).then_some(())
    })
    .await;
    let (ready, why) = dedupq.readyz().await;
    assert!(
        !ready && why.contains(&format!("retry after {RETRY_AFTER}s")),
        "{why}"
    );
    // The calls already on their way when the first 429 came back end;
    // then nothing, for as long as the provider asked (the window below
    // ends at most ~5.5 s after that first 429).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = calls(dedupq).await;
    assert!(before >= 1.0);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        calls(dedupq).await,
        before,
        "no request reaches the provider before its Retry-After is up"
    );
    assert_eq!(provider.stats().await.charges, 0);
    assert_eq!(dedupq.metric("dedupq_dead_letters_total").await, 0.0);

    provider
        .set_knobs(json!({ "answer_status_rate": 0.0 }))
        .await;
    run.charged_once_after_the_pause(&store, &provider, N).await;
    run.stop().await;
}
