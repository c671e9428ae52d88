//! "Failed although charged": the first call outlives `handler.timeout`, so
//! its outcome is unknown; the retries, sent with the same derived key,
//! get 409 while the provider still runs the first request. Those answers
//! settle nothing: after `max_attempts` the key is held `unknown`,
//! dead-lettered `outcome_unknown` and listed by `keys list --unknown`,
//! while the provider charged once. Through the real Kafka broker.

use crate::support::kafka::header_str;
use crate::support::payments::{KafkaPayments, Setup};
use crate::support::process::Provider;
use crate::support::{cli, http_handler};
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HttpHandler};
use dedupq::provider::Knobs;
use dedupq::store::{KeyRow, KeyStatus};
use std::time::Duration;

const KEY: &str = "hung-1";
const BODY: &[u8] = br#"{"amount":4200,"currency":"EUR","recipient":"shop-1"}"#;

/// What the run left: dedupq's row, the provider's charges, the dead
/// letter's reason.
struct Seen {
    row: KeyRow,
    charges: usize,
    dead_letter: String,
}

/// What is wrong with it for money: an empty list is the rule kept.
fn violations(seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    if seen.charges > 0 && seen.row.status == KeyStatus::Failed {
        out.push("stored failed although the provider charged".to_string());
    }
    if seen.row.status != KeyStatus::Unknown || seen.row.lease_until.is_some() {
        out.push(format!(
            "not held unknown: {} (lease {:?})",
            seen.row.status.as_str(),
            seen.row.lease_until
        ));
    }
    if seen.dead_letter != "outcome_unknown" {
        out.push(format!("dead-lettered as {}", seen.dead_letter));
    }
    if seen.charges != 1 {
        out.push(format!("{} charges", seen.charges));
    }
    out
}

/// A provider that charges and then answers only after 5 s, a handler
/// timeout of 700 ms and three attempts.
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

    let dead = pipeline.dead_letters(1).await;
    pipeline.wait_committed().await;
    let row = pipeline
        .wait_row(KEY, "three attempts ended", |r| {
            r.attempts == 3 && r.lease_until.is_none()
        })
        .await;
    let seen = Seen {
        row,
        charges: provider.charges_for("acme:hung-1").await.len(),
        dead_letter: header_str(&dead[0], "dedupq-reason"),
    };
    (seen, pipeline)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_whose_retries_get_409_while_the_first_call_charges_is_held_unknown_never_failed()
{
    let (seen, pipeline) = hung_payment(Setup::new).await;

    assert_eq!(violations(&seen), Vec::<String>::new());
    assert_eq!(seen.row.result_status, None, "no answer stored");
    assert!(
        seen.row
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("409")),
        "the last attempt was answered 409: {:?}",
        seen.row.last_error
    );
    let listed = cli::run(&pipeline.cli_config(), &["keys", "list", "--unknown"], &[]);
    let keys: Vec<String> = listed
        .json_lines()
        .iter()
        .map(|l| l["key"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(keys, [KEY], "keys list --unknown shows the held key");
    pipeline.stop().await;
}

/// The rule before it was fixed, as a handler: an attempt with no answer
/// counts as "nothing happened", so the 409s that follow exhaust the
/// retries and the key is stored failed.
struct TimeoutsAsRefusals(HttpHandler);

#[async_trait::async_trait]
impl Handler for TimeoutsAsRefusals {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        match self.0.handle(call).await {
            HandlerOutcome::Unknown { error } => HandlerOutcome::Transient {
                status: None,
                error,
                retry_after: None,
            },
            other => other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_settles_an_unknown_outcome_with_409s_is_caught_storing_failed_although_charged(
) {
    let (seen, pipeline) = hung_payment(|h| Setup::new(TimeoutsAsRefusals(h))).await;

    let found = violations(&seen);
    assert!(
        found.contains(&"stored failed although the provider charged".to_string()),
        "{found:?}"
    );
    assert_eq!(seen.dead_letter, "exhausted_retries");
    pipeline.stop().await;
}
