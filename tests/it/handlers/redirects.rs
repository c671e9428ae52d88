//! Redirects turned the charge into a GET: reqwest followed a 301/302 and
//! dropped the body, and the key was stored `done` with the provider's
//! listing of all charges. A 3xx is a configuration fault: nothing stored,
//! no GET, counted, /readyz says the handler is down — and once the
//! provider answers properly the payment is stored `done`, charged once.

use crate::support::kafka;
use crate::support::payments::{kafka_process_config, readyz, KafkaPayments, Setup, TENANT, WAIT};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use dedupq::store::{KeyRow, KeyStatus};
use dedupq_provider::Knobs;
use serde_json::json;

const BODY: &[u8] = br#"{"amount":300,"currency":"EUR"}"#;
const REDIRECTS: [u16; 5] = [301, 302, 303, 307, 308];
const FAULTS: &str = r#"dedupq_handler_faults_total{reason="redirect"}"#;

/// Stored as settled although the provider charged nothing.
fn done_without_a_charge(row: &KeyRow, charges: i64) -> bool {
    row.status == KeyStatus::Done && charges == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redirect_is_a_fault_never_a_done_payment_until_the_provider_answers_properly() {
    let provider = Provider::start(Knobs::default()).await;
    let (store, store_settings) = isolated_store().await;
    let (topic, _) = kafka::topics("redirect", 1).await;
    let base = base_config(&store_settings, &provider);
    let dedupq = Dedupq::start(&kafka_process_config(&base, &topic, &unique("g"))).await;
    let key = crate::support::payments::identity("moved-1");

    provider
        .set_knobs(json!({"answer_status": 301, "answer_status_rate": 1.0}))
        .await;
    kafka::produce(
        &kafka::producer(),
        &topic,
        0,
        &kafka::headers(TENANT, "moved-1"),
        BODY,
    )
    .await;
    let mut seen = 0.0;
    for status in REDIRECTS {
        provider
            .set_knobs(json!({"answer_status": status, "answer_status_rate": 1.0}))
            .await;
        // Two more faults: at least one under this status, and retried.
        let before = seen;
        seen = eventually(WAIT, "the redirect is retried as a fault", || async {
            let n = dedupq.metric(FAULTS).await;
            (n >= before + 2.0).then_some(n)
        })
        .await;
        let row = store.show_key(&key).await.unwrap().expect("claimed");
        assert_eq!(
            row.status,
            KeyStatus::InProgress,
            "{status}: nothing stored"
        );
        assert_eq!(row.result_body.as_ref().map(|b| b.get()), None, "{status}");
        let (ready, why) = readyz(dedupq.http).await;
        assert!(!ready && why.contains("handler down"), "{status}: {why}");
        assert_eq!(provider.stats().await.charges, 0, "{status}: no charge");
    }
    eventually(WAIT, "every fault counted as an outcome", || async {
        let counted = dedupq
            .metric(r#"dedupq_messages_total{outcome="handler_fault"}"#)
            .await;
        (counted >= seen).then_some(())
    })
    .await;

    provider.set_knobs(json!({"answer_status_rate": 0.0})).await;
    let row = eventually(WAIT, "the payment is done", || async {
        store
            .show_key(&key)
            .await
            .unwrap()
            .filter(|r| r.status == KeyStatus::Done)
    })
    .await;
    let charges = provider.charges_for("acme:moved-1").await;
    assert_eq!(charges.len(), 1);
    let result: serde_json::Value =
        serde_json::from_str(row.result_body.as_ref().expect("a result").get()).unwrap();
    assert_eq!(result["id"], format!("ch_{}", charges[0].id));
    assert_eq!(
        charges[0].request.as_bytes(),
        BODY,
        "the POST, with its body"
    );
    assert!(!done_without_a_charge(&row, charges.len() as i64));
    eventually(WAIT, "ready again", || async {
        readyz(dedupq.http).await.0.then_some(())
    })
    .await;
}

/// The forwarder before the fix: a client that follows redirects, so a
/// POST answered 302 becomes a GET of the listing, answered 200.
struct FollowingForwarder {
    url: String,
}

#[async_trait::async_trait]
impl Handler for FollowingForwarder {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        let sent = reqwest::Client::new()
            .post(&self.url)
            .header("idempotency-key", call.derived_key)
            .header("content-type", "application/json")
            .body(call.request.body.to_vec())
            .send()
            .await;
        let Ok(answer) = sent else {
            return HandlerOutcome::Transient {
                status: None,
                error: "unreachable".into(),
                retry_after: None,
            };
        };
        let status = i32::from(answer.status().as_u16());
        let body = answer.bytes().await.unwrap_or_default().to_vec();
        let result = HandlerResult {
            status,
            body,
            content_type: None,
        };
        if (200..300).contains(&status) {
            HandlerOutcome::Success(result)
        } else {
            HandlerOutcome::Permanent(result)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarder_that_follows_redirects_is_caught_storing_done_without_a_charge() {
    let provider = Provider::start(Knobs {
        answer_status: Some(302),
        answer_status_rate: 1.0,
        ..Knobs::default()
    })
    .await;
    let pipeline = KafkaPayments::start(Setup::new(FollowingForwarder {
        url: provider.charges_url(),
    }))
    .await;

    pipeline.send("moved-2", BODY, &[]).await;
    let row = pipeline.wait_status("moved-2", KeyStatus::Done).await;

    assert!(done_without_a_charge(&row, provider.stats().await.charges));
    let stored: serde_json::Value =
        serde_json::from_str(row.result_body.as_ref().expect("a result").get()).unwrap();
    assert!(
        stored.get("charges").is_some(),
        "the listing was stored: {stored}"
    );
    pipeline.stop().await;
}
