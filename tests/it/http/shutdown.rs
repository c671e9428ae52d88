//! Graceful shutdown: stop accepting, let in-flight requests finish.

use super::harness::App;
use crate::support::eventually;
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_shutdown_a_request_in_flight_finishes_and_new_connections_are_refused() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(1500),
        ..Knobs::default()
    })
    .await;
    let app = App::with(&provider, |_, _| {}).await;
    let api = app.base.trim_start_matches("http://").to_string();
    let url = app.url("payments");
    let in_flight = tokio::spawn(async move {
        let r = super::harness::client()
            .post(url)
            .bearer_auth(super::harness::ACME_KEY)
            .header("Idempotency-Key", "pay-sd1")
            .body(r#"{"amount": 5}"#)
            .send()
            .await
            .expect("answered");
        super::harness::Reply::from(r).await
    });
    eventually(
        Duration::from_secs(10),
        "the request is running",
        || async {
            (app.status("acme", "pay-sd1").await.as_deref() == Some("in_progress")).then_some(())
        },
    )
    .await;

    let stopping = tokio::spawn(app.stop());
    eventually(
        Duration::from_secs(5),
        "new connections refused",
        || async {
            tokio::net::TcpStream::connect(&api)
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    let answer = in_flight.await.unwrap();
    assert_eq!(
        answer.status, 201,
        "the request in flight finished: {answer:?}"
    );
    let took = stopping.await.unwrap();
    assert!(
        took < Duration::from_secs(15),
        "bounded by api.shutdown_timeout: {took:?}"
    );
    assert_eq!(provider.stats().await.charges, 1);
}
