//! What the simulator received, and how it compares a repeated key's body.

use crate::support::process::Provider;
use dedupq::fingerprint::hex;
use dedupq_provider::{Compare, Knobs};
use sha2::{Digest, Sha256};

const JSON: &str = "application/json";

async fn id_of(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.expect("a JSON answer");
    (status, body["id"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn the_charge_keeps_the_request_bytes_and_content_type_exactly_as_received() {
    let provider = Provider::start(Knobs::default()).await;
    let body =
        br#"{"z":1, "amount":10.000000000000001,"big":18446744073709551616,"neg":-0,"e":1e1}"#;

    let answer = provider
        .post_raw("acme:exact", "application/json; charset=utf-8", body)
        .await;

    assert_eq!(answer.status(), 201);
    let answer: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(answer["request_sha256"], hex(&Sha256::digest(body)));
    let charges = provider.charges_for("acme:exact").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].request.as_bytes(), body);
    assert_eq!(
        charges[0].content_type.as_deref(),
        Some("application/json; charset=utf-8")
    );
    // The parsed view is not the request: a forwarder that re-serialises
    // the JSON is told apart by comparing `request`.
    assert_ne!(serde_json::to_vec(&charges[0].body).unwrap(), body);
}

#[tokio::test]
async fn with_byte_comparison_any_byte_difference_under_one_key_is_refused_with_422() {
    let provider = Provider::start(Knobs {
        compare: Compare::Bytes,
        ..Knobs::default()
    })
    .await;
    let first = br#"{"amount":10.0,"currency":"EUR"}"#;

    let (created, id) = id_of(provider.post_raw("acme:b1", JSON, first).await).await;
    let (replayed, same_id) = id_of(provider.post_raw("acme:b1", JSON, first).await).await;
    let reordered = provider
        .post_raw("acme:b1", JSON, br#"{"currency":"EUR","amount":10.0}"#)
        .await;
    let respaced = provider
        .post_raw("acme:b1", JSON, br#"{"amount": 10.0, "currency": "EUR"}"#)
        .await;
    let renumbered = provider
        .post_raw("acme:b1", JSON, br#"{"amount":10,"currency":"EUR"}"#)
        .await;

    assert_eq!((created, replayed), (201, 200));
    assert_eq!(id, same_id);
    assert_eq!(reordered.status(), 422);
    assert_eq!(respaced.status(), 422);
    assert_eq!(renumbered.status(), 422);
    assert_eq!(provider.stats().await.charges, 1);
}

/// The default: canonical JSON, so the same three variants are one request
/// (which is what makes the byte comparison above a distinct behaviour).
#[tokio::test]
async fn with_json_comparison_key_order_and_whitespace_do_not_matter_but_values_do() {
    let provider = Provider::start(Knobs::default()).await;

    let (created, id) = id_of(
        provider
            .post_raw("acme:j1", JSON, br#"{"amount":10.5,"currency":"EUR"}"#)
            .await,
    )
    .await;
    let (reordered, same_id) = id_of(
        provider
            .post_raw("acme:j1", JSON, br#"{ "currency": "EUR", "amount": 10.5 }"#)
            .await,
    )
    .await;
    let changed = provider
        .post_raw("acme:j1", JSON, br#"{"amount":10.6,"currency":"EUR"}"#)
        .await;

    assert_eq!((created, reordered), (201, 200));
    assert_eq!(id, same_id);
    assert_eq!(changed.status(), 422);
    assert_eq!(provider.stats().await.charges, 1);
}
