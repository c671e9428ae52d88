use crate::support::{self, handlers::Recording, process::metric_value};
use dedupq::config::{HttpSettings, Settings};
use dedupq::startup::Application;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn metrics_report_known_input_and_readyz_reflects_the_store() {
    let (_, store_settings) = support::isolated_store().await;
    let settings = Settings {
        store: store_settings,
        http: HttpSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..HttpSettings::default()
        },
        ..Settings::default()
    };
    let app = Application::build_with_handler(settings, Arc::new(Recording::default()))
        .await
        .unwrap();
    let addr = app.local_addr();
    let engine = app.pipeline().clone();
    let stop = app.shutdown_token();
    let batch = [
        support::message("acme", "m1", r#"{"amount": 1}"#),
        support::message("acme", "m2", r#"{"amount": 2}"#),
        support::message("acme", "m1", r#"{"amount": 1}"#),
        support::message("acme", "m2", r#"{"amount": 99}"#),
        support::message("acme", "m3", "not json"),
    ];
    engine.process(&batch).await.unwrap();
    // Served from here on; the key gauges are sampled when upkeep starts.
    let running = tokio::spawn(app.run_until_stopped());

    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v = |series: &str| metric_value(&text, series);
    assert_eq!(v(r#"dedupq_messages_total{outcome="processed""#), 2.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="duplicate""#), 1.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="conflict""#), 1.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="invalid""#), 1.0);
    assert_eq!(v(r#"dedupq_claims_total{result="won""#), 2.0);
    // Decided, but nothing was published: dead letters are counted once a
    // broker confirmed them (the transport tests check that), not here.
    assert_eq!(v("dedupq_dead_letters_total"), 0.0);
    assert_eq!(v("dedupq_handler_duration_seconds_count"), 2.0);
    assert_eq!(
        v("dedupq_claim_batch_size_count"),
        2.0,
        "two rounds: first occurrences, then repeats"
    );
    assert_eq!(v("dedupq_fenced_writes_total"), 0.0);
    assert!(!text.contains("acme"), "no tenant or key in any label");

    let done = support::eventually(Duration::from_secs(20), "key gauge sampled", || async {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let done = metric_value(&text, r#"dedupq_keys{status="done""#);
        (done > 0.0).then_some(done)
    })
    .await;
    assert_eq!(done, 2.0);

    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(ready.text().await.unwrap().contains("store up"));
    assert_eq!(
        reqwest::get(format!("http://{addr}/healthz"))
            .await
            .unwrap()
            .status(),
        200
    );

    stop.cancel();
    running.await.unwrap().unwrap();
}
