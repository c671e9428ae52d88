//! "Failed although charged": the first call outlives `handler.timeout`, so
//! its outcome is unknown; the retries, sent with the same derived key,
//! get 409 while the provider still runs the first request. A 409 settles
//! nothing and uses no attempt (the provider is still working on the key):
//! the retries back off until the first request completes, and then the
//! provider's replay of it settles the key `done` with the one charge.
//! Through the real Kafka broker.

use crate::support::http_handler;
use crate::support::payments::{KafkaPayments, Setup};
use crate::support::process::Provider;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HttpHandler};
use dedupq::store::{KeyRow, KeyStatus};
use dedupq_provider::Knobs;
use std::time::Duration;

const KEY: &str = "hung-1";
const BODY: &[u8] = br#"{"amount":4200,"currency":"EUR","recipient":"shop-1"}"#;

/// What the run left: dedupq's row and the provider's charges.
struct Seen {
    row: KeyRow,
    charges: usize,
}

/// What is wrong with it for money: an empty list is the rule kept.
fn violations(seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    if seen.charges > 0 && seen.row.status == KeyStatus::Failed {
        out.push("stored failed although the provider charged".to_string());
    }
    if seen.row.status != KeyStatus::Done {
        out.push(format!("not done: {}", seen.row.status.as_str()));
    }
    if seen.charges != 1 {
        out.push(format!("{} charges", seen.charges));
    }
    out
}

/// A provider that charges and then answers only after 5 s, a handler
/// timeout of 700 ms and three attempts (more than three retries come
/// back 409 meanwhile).
async fn hung_payment(wrap: impl FnOnce(HttpHandler) -> Setup) -> (Seen, KafkaPayments) {
    let provider = Provider::start(Knobs {
        slow_after_charge: Duration::from_secs(5),
        slow_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let mut setup = wrap(http_handler(
        &provider.charges_url(),
        Duration::from_millis(700),
    ));
    setup.max_attempts = 3;
    let pipeline = KafkaPayments::start(setup).await;

    pipeline.send(KEY, BODY, &[]).await;
    pipeline.wait_committed().await;
    let row = pipeline
        .wait_row(KEY, "a final outcome", |r| {
            matches!(r.status, KeyStatus::Done | KeyStatus::Failed)
                || (r.status == KeyStatus::Unknown && r.lease_until.is_none())
        })
        .await;
    let seen = Seen {
        row,
        charges: provider.charges_for("acme:hung-1").await.len(),
    };
    (seen, pipeline)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_whose_retries_get_409_while_the_first_call_charges_settles_done_with_that_charge(
) {
    let (seen, pipeline) = hung_payment(Setup::new).await;

    assert_eq!(violations(&seen), Vec::<String>::new());
    assert!(
        seen.row.attempts - seen.row.uncounted_attempts <= 3,
        "the 409s used no attempt: {} counted of {}",
        seen.row.attempts - seen.row.uncounted_attempts,
        seen.row.attempts
    );
    assert!(
        seen.row.result_body.is_some(),
        "the provider's answer to the first request is stored"
    );
    pipeline.stop().await;
}

/// A plausible bug, as a handler: a 409 read as a refusal ("Conflict"),
/// so the provider's "still working on this key" stores the charged
/// payment as failed.
struct ConflictAsRefusal(HttpHandler);

#[async_trait::async_trait]
impl Handler for ConflictAsRefusal {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        match self.0.handle(call).await {
            HandlerOutcome::Transient {
                status: Some(409),
                error,
                ..
            } => HandlerOutcome::Permanent(dedupq::handler::HandlerResult::json(
                409,
                &serde_json::json!({ "error": error }),
            )),
            other => other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_reads_a_409_as_a_refusal_is_caught_storing_failed_although_charged() {
    let (seen, pipeline) = hung_payment(|h| Setup::new(ConflictAsRefusal(h))).await;

    let found = violations(&seen);
    assert!(
        found.contains(&"stored failed although the provider charged".to_string()),
        "{found:?}"
    );
    pipeline.stop().await;
}
