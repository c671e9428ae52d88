//! The provider in an outage (every POST answered a bare 503, nothing
//! charged) while payments keep arriving; and a provider that charged and
//! then answered 500, replaying that 500 to the same key as Stripe's v1
//! API does. No payment is stored failed, none is given up: intake pauses,
//! one probe at a time tests the provider, and everything is charged once
//! when it is back; a 500 after a charge is `unknown`, never `failed`.

use super::common::{calls, set, status, KafkaRun, Run, Transport, TENANT};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store};
use dedupq::identity::{IdempotencyKey, Identity, Tenant};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const OUTAGE: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_payments_arriving_during_a_provider_outage_pause_intake_and_are_all_charged_once_when_it_is_back(
) {
    payments_during_an_outage(Transport::Kafka).await;
}

/// On RabbitMQ the deliveries are held unacked while intake pauses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_payments_arriving_during_a_provider_outage_are_held_unacked_and_all_charged_once_when_it_is_back(
) {
    payments_during_an_outage(Transport::Amqp).await;
}

async fn payments_during_an_outage(transport: Transport) {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let mut base = base_config(&store_settings, &provider);
    // Shorter than the outage: time paused for it must not count.
    set(&mut base, "handler", "retry_for", "4s");
    let mut run = Run::start(transport, "outage", &base).await;

    provider
        .set_knobs(json!({ "fail_rate": 1.0, "fail_retry_after": false }))
        .await;
    let started = tokio::time::Instant::now();
    const N: usize = 20;
    for k in 0..N {
        run.pay(k).await;
        // The first few together (the outage is seen across them), the
        // rest spread over it.
        if k >= 3 {
            tokio::time::sleep(OUTAGE / (N as u32 * 2)).await;
        }
    }
    let dedupq = run.dedupq();
    eventually(Duration::from_secs(10), "intake paused", || async {
        (dedupq.metric("dedupq_handler_paused").await == 1.0).then_some(())
    })
    .await;
    let (ready, why) = dedupq.readyz().await;
    assert!(!ready && why.contains("provider outage"), "{why}");
    tokio::time::sleep(OUTAGE.saturating_sub(started.elapsed())).await;
    let during = calls(dedupq).await;
    assert!(
        during <= 60.0,
        "only probes reach a provider in an outage, one at a time: {during} calls"
    );
    assert_eq!(provider.stats().await.charges, 0);
    let dead = |m: String| {
        m.lines()
            .filter(|l| l.starts_with("dedupq_dead_letters_total") && !l.ends_with(" 0"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        dead(dedupq.metrics().await).is_empty(),
        "{:?}",
        dead(dedupq.metrics().await)
    );
    if let Run::Amqp(amqp) = &run {
        amqp.holds(N).await;
    }

    provider.set_knobs(json!({ "fail_rate": 0.0 })).await;
    run.charged_once_after_the_pause(&store, &provider, N).await;
    run.stop().await;
}

/// A provider that charges and then answers 500 to the first request of
/// `pay-0`; `replay`: repeats of the key get that 500 again.
async fn charged_then_500(replay: bool) -> (String, usize, Dedupq) {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs {
        error_after_charge_next: 1,
        error_after_charge_replay: replay,
        ..Knobs::default()
    })
    .await;
    let base = base_config(&store_settings, &provider);
    let run = KafkaRun::start("err_after_charge", 1, &base).await;
    run.pay(0, TENANT, "pay-0", 0).await;
    run.wait_committed_to_end(Duration::from_secs(60)).await;
    // A duplicate afterwards is answered with what is stored.
    run.pay(0, TENANT, "pay-0", 0).await;
    run.wait_committed_to_end(Duration::from_secs(30)).await;
    let charges = provider.charges_for(&format!("{TENANT}:pay-0")).await.len();
    let stored = status(&store, "pay-0").await.unwrap_or_default();
    (stored, charges, run.dedupq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_500_after_the_provider_charged_is_unknown_and_settles_done_with_that_charge() {
    let (stored, charges, mut dedupq) = charged_then_500(false).await;
    assert_eq!(charges, 1);
    assert_eq!(
        stored, "done",
        "the retry with the same key gets the charge"
    );
    assert!(
        dedupq
            .metric(r#"dedupq_messages_total{outcome="unknown"}"#)
            .await
            >= 1.0
    );
    dedupq.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_500_replayed_for_a_charged_key_holds_it_unknown_and_never_stores_it_failed() {
    let (stored, charges, mut dedupq) = charged_then_500(true).await;
    assert_eq!(charges, 1);
    assert_eq!(
        stored, "unknown",
        "charged and answered 500 on every try: unknown, never failed"
    );
    assert_eq!(
        dedupq
            .metric(r#"dedupq_dead_letters_total{reason="outcome_unknown"}"#)
            .await,
        1.0
    );
    assert_eq!(
        dedupq
            .metric(r#"dedupq_messages_total{outcome="failed"}"#)
            .await,
        0.0
    );
    dedupq.kill();
}

/// A probe is a real request: the provider may charge it. Here the probe
/// is charged and never answered (the handler times out), and the
/// provider does not honour keys, so the retry that settles the key
/// charges again, which no client can prevent with such a provider. What
/// dedupq must keep: the probe's attempt is not counted, yet keeps its
/// number, so the two requests of the key carry different
/// `X-Dedupq-Attempt`s and `attempts` counts both. (Given back as a
/// probe's attempt once was, the retry carried the probe's number, and
/// the provider saw one attempt charge twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_charged_without_an_answer_keeps_its_attempt_number_and_the_retry_carries_the_next()
{
    let (store, store_settings) = isolated_store().await;
    // Every request refused with a 503 and `Retry-After: 1`, nothing
    // charged: intake pauses at the first.
    let provider = Provider::start(Knobs {
        fail_rate: 1.0,
        fail_retry_after: true,
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let mut base = base_config(&store_settings, &provider);
    set(&mut base, "handler", "timeout", "1s");
    let run = KafkaRun::start("probe", 1, &base).await;
    run.pay(0, TENANT, "pay-0", 0).await;
    eventually(Duration::from_secs(20), "intake paused", || async {
        (run.dedupq.metric("dedupq_handler_paused").await == 1.0).then_some(())
    })
    .await;
    // The next request, a probe, is charged and never answered.
    provider
        .set_knobs(json!({ "fail_rate": 0.0, "hang_after_charge_next": 1 }))
        .await;
    eventually(Duration::from_secs(40), "pay-0 settled", || async {
        (status(&store, "pay-0").await.as_deref() == Some("done")).then_some(())
    })
    .await;

    let charges = provider.charges_for(&format!("{TENANT}:pay-0")).await;
    assert_eq!(
        charges.len(),
        2,
        "the probe's charge and the retry's: {charges:?}"
    );
    let attempts: Vec<i32> = charges.iter().map(|c| c.attempt.unwrap_or(0)).collect();
    assert_ne!(
        attempts[0], attempts[1],
        "two requests of one key carried the same attempt number"
    );
    let epochs: Vec<i64> = charges.iter().map(|c| c.epoch.unwrap_or(0)).collect();
    assert!(
        0 < epochs[0] && epochs[0] < epochs[1],
        "each request names its own claim, the later one the newer: {epochs:?}"
    );
    let row = store
        .show_key(&Identity {
            tenant: Tenant::parse(TENANT.as_bytes()).unwrap(),
            key: IdempotencyKey::parse(b"pay-0").unwrap(),
        })
        .await
        .unwrap()
        .expect("the key's row");
    assert!(
        attempts.iter().all(|a| *a >= 1 && *a <= row.attempts),
        "attempts {attempts:?} beyond the key's {} requests",
        row.attempts
    );
    assert!(
        row.uncounted_attempts >= 1,
        "the failed probe is not counted: {row:?}"
    );
    run.wait_committed_to_end(Duration::from_secs(30)).await;
    assert_eq!(run.dedupq.metric("dedupq_dead_letters_total").await, 0.0);
    let mut dedupq = run.dedupq;
    dedupq.kill();
}
