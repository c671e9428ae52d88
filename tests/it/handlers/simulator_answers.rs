//! Answers a careless client mishandles: statuses instead of a charge,
//! redirects, and bodies PostgreSQL's jsonb or a UTF-8 decoder refuse.

use crate::support::process::Provider;
use crate::support::provider_api::no_redirects;
use dedupq_provider::{Knobs, OddAnswer, STATUS_ANSWERS};
use serde_json::json;

const JSON: &str = "application/json";

#[tokio::test]
async fn a_status_answered_instead_of_charging_charges_nothing_and_redirects_point_at_the_listing()
{
    let provider = Provider::start(Knobs::default()).await;
    for (n, status) in STATUS_ANSWERS.into_iter().enumerate() {
        // A 429 is a rate limit: it says when to come back.
        let retry_after = (status == 429).then_some(3);
        provider
            .set_knobs(json!({
                "answer_status": status,
                "answer_status_next": 1,
                "answer_retry_after": retry_after
            }))
            .await;
        let key = format!("acme:status-{n}");

        let answered = provider.post_raw(&key, JSON, br#"{"amount":1}"#).await;
        let next = provider.post_raw(&key, JSON, br#"{"amount":1}"#).await;

        assert_eq!(answered.status().as_u16(), status);
        let header = |name: &str| {
            answered
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        match status {
            301..=308 => assert_eq!(header("location"), Some(provider.charges_url())),
            401 => assert_eq!(header("www-authenticate").as_deref(), Some("Bearer")),
            405 => assert_eq!(header("allow").as_deref(), Some("GET")),
            _ => {}
        }
        assert_eq!(
            header("retry-after"),
            retry_after.map(|s| s.to_string()),
            "{status}"
        );
        assert_eq!(next.status(), 201, "{status}: only the next request");
        assert_eq!(
            provider.charges_for(&key).await.len(),
            1,
            "{status}: charged once, by the second"
        );
    }
}

/// Why a caller must not follow redirects: reqwest by default turns the
/// POST into a GET of the listing and reports a success with no charge.
#[tokio::test]
async fn a_client_that_follows_a_302_gets_200_with_the_charge_listing_and_nothing_is_charged() {
    let provider = Provider::start(Knobs {
        answer_status: Some(302),
        answer_status_next: 1,
        ..Knobs::default()
    })
    .await;

    let followed = reqwest::Client::new()
        .post(provider.charges_url())
        .header("idempotency-key", "acme:followed")
        .json(&json!({"amount": 1}))
        .send()
        .await
        .unwrap();

    assert_eq!(followed.status(), 200);
    let listing: serde_json::Value = followed.json().await.unwrap();
    assert_eq!(listing["count"], 0, "the listing, not a charge");
    assert_eq!(provider.stats().await.charges, 0);
}

#[tokio::test]
async fn knobs_the_simulator_cannot_use_are_refused_naming_the_knob() {
    let provider = Provider::start(Knobs::default()).await;

    for (patch, knob) in [
        (json!({"answer_status": 500}), "answer_status"),
        (json!({"answer_status_next": 1}), "answer_status"),
        (json!({"odd_answer_next": 1}), "odd_answer"),
        (json!({"fail_rate": 1.5}), "fail_rate"),
        (json!({"compare": "xml"}), "compare"),
    ] {
        let answer = provider.try_knobs(patch.clone()).await;

        assert_eq!(answer.status(), 400, "{patch}");
        let body: serde_json::Value = answer.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains(knob),
            "{patch}: {body}"
        );
    }
    let knobs: Knobs = no_redirects()
        .get(format!("{}/admin/knobs", provider.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(knobs, Knobs::default(), "nothing was applied");
}

async fn bytes(response: reqwest::Response) -> (u16, Vec<u8>) {
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn an_answer_with_a_nul_escape_is_valid_json_and_replayed_and_looked_up_byte_for_byte() {
    let provider = Provider::start(Knobs {
        odd_answer: Some(OddAnswer::NulEscape),
        odd_answer_next: 1,
        ..Knobs::default()
    })
    .await;

    let (status, first) = bytes(
        provider
            .post_raw("acme:nul", JSON, br#"{"amount":1}"#)
            .await,
    )
    .await;
    let (replay_status, replay) = bytes(
        provider
            .post_raw("acme:nul", JSON, br#"{"amount":1}"#)
            .await,
    )
    .await;
    let (_, looked_up) = bytes(provider.lookup("acme:nul").await).await;

    assert_eq!((status, replay_status), (201, 200));
    let parsed: serde_json::Value = serde_json::from_slice(&first).expect("valid JSON");
    assert_eq!(parsed["note"], "before\u{0}after");
    assert!(first.windows(6).any(|w| w == br"\u0000"));
    assert_eq!(replay, first);
    assert_eq!(looked_up, first);
    assert_eq!(provider.stats().await.charges, 1);
}

#[tokio::test]
async fn an_answer_with_a_raw_nul_and_non_utf8_bytes_is_kept_and_replayed_byte_for_byte() {
    let provider = Provider::start(Knobs {
        odd_answer: Some(OddAnswer::RawBytes),
        odd_answer_next: 1,
        ..Knobs::default()
    })
    .await;

    let first = provider
        .post_raw("acme:raw", JSON, br#"{"amount":1}"#)
        .await;
    let content_type = first.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    let (status, first) = bytes(first).await;
    let (_, replay) = bytes(
        provider
            .post_raw("acme:raw", JSON, br#"{"amount":1}"#)
            .await,
    )
    .await;
    let (_, looked_up) = bytes(provider.lookup("acme:raw").await).await;

    assert_eq!(status, 201);
    assert_eq!(content_type, JSON, "labelled JSON all the same");
    assert!(first.windows(3).any(|w| w == b"\x00\xff\xfe"));
    assert!(std::str::from_utf8(&first).is_err());
    assert!(serde_json::from_slice::<serde_json::Value>(&first).is_err());
    assert_eq!(replay, first);
    assert_eq!(looked_up, first);
    let charges = provider.charges_for("acme:raw").await;
    assert_eq!((charges.len(), charges[0].response.is_none()), (1, true));
}
