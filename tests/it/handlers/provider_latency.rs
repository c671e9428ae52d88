use crate::support::{self, process::Provider};
use dedupq::engine::Outcome;
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_deliveries_with_a_slow_provider_charge_once() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(300),
        ..Knobs::default()
    })
    .await;
    let engine = super::payment_engine(&provider, Duration::from_secs(5)).await;
    let msg = support::message("acme", "order-300", r#"{"amount": 300, "currency": "EUR"}"#);

    let (one, two) = ([msg.clone()], [msg.clone()]);
    let (a, b) = tokio::join!(engine.process(&one), engine.process(&two));
    let mut outcomes = vec![a.unwrap()[0].outcome, b.unwrap()[0].outcome];
    outcomes.sort_by_key(|o| o.label());

    assert!(outcomes.contains(&Outcome::Processed), "{outcomes:?}");
    let stats = provider.stats().await;
    assert_eq!(stats.charges, 1);
    assert_eq!(stats.double_charged, 0);
    assert_eq!(provider.charges_for("acme:order-300").await.len(), 1);
}
