use crate::support::process::Provider;
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

async fn post(
    client: &reqwest::Client,
    provider: &Provider,
    key: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    client
        .post(provider.charges_url())
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_simulator_replays_a_key_refuses_a_changed_body_and_reports_a_running_key() {
    // Long enough for the repeat to arrive while the first runs, on a busy
    // machine too.
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(2),
        ..Knobs::default()
    })
    .await;
    let client = reqwest::Client::new();
    let body = json!({"amount": 1, "currency": "EUR"});

    let (first, concurrent) = tokio::join!(post(&client, &provider, "t:k1", body.clone()), async {
        // Once the first is running (its charge recorded, its answer due).
        crate::support::eventually(Duration::from_secs(10), "the first charge", || async {
            (!provider.charges_for("t:k1").await.is_empty()).then_some(())
        })
        .await;
        post(&client, &provider, "t:k1", body.clone()).await
    });
    assert_eq!(first.status(), 201);
    assert_eq!(concurrent.status(), 409, "a repeat while the first runs");
    let first_body: serde_json::Value = first.json().await.unwrap();

    let replay = post(&client, &provider, "t:k1", body.clone()).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(
        replay.json::<serde_json::Value>().await.unwrap()["id"],
        first_body["id"]
    );

    let changed = post(
        &client,
        &provider,
        "t:k1",
        json!({"amount": 2, "currency": "EUR"}),
    )
    .await;
    assert_eq!(changed.status(), 422);
    let stats = provider.stats().await;
    assert_eq!((stats.charges, stats.keys), (1, 1));
}

#[tokio::test]
async fn the_simulator_lists_charges_by_tenant() {
    let provider = Provider::start(Knobs::default()).await;
    let client = reqwest::Client::new();
    for (key, amount) in [("acme:a", 1), ("acme:b", 2), ("globex:a", 3)] {
        assert_eq!(
            post(&client, &provider, key, json!({"amount": amount}))
                .await
                .status(),
            201
        );
    }
    let listed: serde_json::Value = client
        .get(provider.charges_url())
        .query(&[("tenant", "acme")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["count"], 2);
}
