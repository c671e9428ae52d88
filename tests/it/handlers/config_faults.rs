//! Misconfiguration was final forever: a 401 after an API key rotation or
//! a 404 from a mistyped URL stored every payment of that period `failed`
//! and replayed it. Such answers are handler faults: nothing stored,
//! retried with backoff, counted, /readyz degraded; after the fix the
//! payments complete. `keys reset` runs again what was stored wrongly.

use crate::support::payments::{
    identity, kafka_process_config, readyz, KafkaPayments, Setup, TENANT, WAIT,
};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{cli, eventually, isolated_store, kafka, unique};
use dedupq::config::HandlerSettings;
use dedupq::handler::HttpHandler;
use dedupq::store::{KeyRow, KeyStatus};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const BODY: &[u8] = br#"{"amount":700,"currency":"EUR"}"#;

/// A configuration fault stored as the payment's outcome.
fn stored_a_fault(row: &KeyRow) -> bool {
    row.status == KeyStatus::Failed && matches!(row.result_status, Some(401 | 403 | 404 | 405))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_url_faults_store_nothing_are_retried_and_counted_and_payments_complete_after_the_fix(
) {
    let provider = Provider::start(Knobs {
        answer_status: Some(401),
        answer_status_rate: 1.0,
        ..Knobs::default()
    })
    .await;
    let (store, store_settings) = isolated_store().await;
    let (topic, _) = kafka::topics("faults", 1).await;
    let base = base_config(&store_settings, &provider);
    let dedupq = Dedupq::start(&kafka_process_config(&base, &topic, &unique("g"))).await;
    let producer = kafka::producer();
    for key in ["rotated-1", "rotated-2"] {
        kafka::produce(&producer, &topic, 0, &kafka::headers(TENANT, key), BODY).await;
    }

    for (status, reason) in [
        (401, "unauthorized"),
        (403, "forbidden"),
        (404, "not_found"),
        (405, "method_not_allowed"),
    ] {
        provider
            .set_knobs(json!({"answer_status": status, "answer_status_rate": 1.0}))
            .await;
        let series = format!(r#"dedupq_handler_faults_total{{reason="{reason}"}}"#);
        eventually(WAIT, "the fault is retried", || async {
            (dedupq.metric(&series).await >= 2.0).then_some(())
        })
        .await;
        let row = store
            .show_key(&identity("rotated-1"))
            .await
            .unwrap()
            .expect("claimed");
        assert_eq!(
            row.status,
            KeyStatus::InProgress,
            "{status}: nothing stored"
        );
        assert_eq!(row.result_status, None, "{status}");
        assert!(
            row.attempts - row.uncounted_attempts <= 1,
            "{status}: faults do not count ({} attempts, {} uncounted)",
            row.attempts,
            row.uncounted_attempts
        );
        let (ready, why) = readyz(dedupq.http).await;
        assert!(!ready && why.contains("handler down"), "{status}: {why}");
    }
    assert_eq!(provider.stats().await.charges, 0);

    provider.set_knobs(json!({"answer_status_rate": 0.0})).await;
    for key in ["rotated-1", "rotated-2"] {
        let row = eventually(WAIT, "the payment completes", || async {
            store
                .show_key(&identity(key))
                .await
                .unwrap()
                .filter(|r| r.status == KeyStatus::Done)
        })
        .await;
        assert!(!stored_a_fault(&row));
        assert_eq!(
            provider.charges_for(&format!("acme:{key}")).await.len(),
            1,
            "{key}"
        );
    }
    eventually(WAIT, "ready again", || async {
        readyz(dedupq.http).await.0.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_stored_as_failed_is_caught_and_keys_reset_runs_the_payment_again() {
    // The rule before the fix: no status is a configuration fault.
    let provider = Provider::start(Knobs {
        answer_status: Some(404),
        answer_status_rate: 1.0,
        ..Knobs::default()
    })
    .await;
    let handler = HttpHandler::new(&HandlerSettings {
        url: provider.charges_url(),
        timeout: Duration::from_secs(5),
        fault_statuses: Vec::new(),
        ..HandlerSettings::default()
    })
    .unwrap();
    let pipeline = KafkaPayments::start(Setup::new(handler)).await;
    pipeline.send("typo-1", BODY, &[]).await;
    let row = pipeline.wait_status("typo-1", KeyStatus::Failed).await;
    assert!(stored_a_fault(&row), "caught: {row:?}");

    // The URL is fixed, but the stored failure is replayed to duplicates.
    provider.set_knobs(json!({"answer_status_rate": 0.0})).await;
    pipeline.send("typo-1", BODY, &[]).await;
    pipeline.wait_committed().await;
    assert_eq!(pipeline.outcomes("duplicate"), 1);
    assert_eq!(provider.stats().await.charges, 0);

    let config = pipeline.cli_config();
    let reset = cli::run(
        &config,
        &[
            "keys",
            "reset",
            "acme",
            "typo-1",
            "--reason",
            "INC-4: handler.url was mistyped",
            "--actor",
            "bob",
        ],
        &[],
    );
    assert_eq!(reset.code, 0, "{}", reset.stderr);
    assert!(
        reset.stdout.contains("was failed with status 404"),
        "{}",
        reset.stdout
    );
    let again = cli::run(
        &config,
        &["keys", "reset", "acme", "typo-1", "--reason", "twice"],
        &[],
    );
    assert_ne!(again.code, 0, "nothing left to reset");

    pipeline.send("typo-1", BODY, &[]).await;
    let row = pipeline.wait_status("typo-1", KeyStatus::Done).await;
    assert_eq!(row.result_status, Some(201));
    assert_eq!(provider.charges_for("acme:typo-1").await.len(), 1);
    let audit: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT action, actor, before FROM dedupq_key_audit")
            .fetch_all(pipeline.store.pool())
            .await
            .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].0.as_str(), audit[0].1.as_str()), ("reset", "bob"));
    assert_eq!(audit[0].2["status"], "failed");
    assert_eq!(audit[0].2["result_status"], 404);
    pipeline.stop().await;
}
