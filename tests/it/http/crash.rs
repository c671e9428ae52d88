//! The seed's worst case with the real `dedupq run` process: the provider
//! charged, and the process is SIGKILLed before it stored the result.

use super::harness::{keys_file, scratch, wait_listening, Reply, ACME_KEY};
use crate::support::process::{base_config, free_port, Dedupq, Provider};
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::net::SocketAddr;
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "RUB", "recipient": "shop-1"}"#;

/// Charges made for one payment when the process dies between the
/// provider's charge and the stored result, and the client then retries
/// until it gets an answer.
async fn charges_after_a_crash_and_a_retry(
    honour_keys: bool,
) -> (Vec<dedupq_provider::Charge>, Reply) {
    let provider = Provider::start(Knobs {
        honour_keys,
        // The first call charges and never answers: the kill lands there.
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (_, store) = isolated_store().await;
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let mut config = base_config(&store, &provider);
    let overrides: toml::Table = format!(
        r#"
[engine]
lease = "8s"
renew_every = "2s"
retry_backoff_min = "50ms"
retry_backoff_max = "500ms"

[handler]
kind = "payment"
url = "{charges}"
timeout = "5s"

[api]
enabled = true
listen = "{api}"
keys_file = "{keys}"
routes = [{{ name = "payments" }}]
"#,
        charges = provider.charges_url(),
        keys = keys_file(&scratch()).display(),
    )
    .parse()
    .expect("config");
    config.extend(overrides);
    let mut dedupq = Dedupq::start(&config).await;
    wait_listening(api).await;

    let url = format!("http://{api}/v1/payments");
    let pay = || {
        super::harness::client()
            .post(&url)
            .bearer_auth(ACME_KEY)
            .header("Idempotency-Key", "pay-crash")
            .body(BODY)
            .send()
    };
    let first = tokio::spawn(pay());
    eventually(Duration::from_secs(10), "the provider charged", || async {
        (provider.stats().await.charges == 1).then_some(())
    })
    .await;
    dedupq.kill();
    assert!(
        first.await.expect("task").is_err(),
        "the first request died with the process"
    );

    dedupq.restart().await;
    wait_listening(api).await;
    let at_once = Reply::from(pay().await.expect("retry")).await;
    assert_eq!(
        at_once.status, 409,
        "the dead owner's lease still holds the key: {at_once:?}"
    );

    let answered = eventually(
        Duration::from_secs(30),
        "the retry after the lease",
        || async {
            let r = Reply::from(pay().await.ok()?).await;
            (r.status != 409).then_some(r)
        },
    )
    .await;
    assert!(
        dedupq.metric("dedupq_lease_takeovers_total").await >= 1.0,
        "the retry took the key over"
    );
    (provider.charges_for("acme:pay-crash").await, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_after_the_provider_charged_the_retry_after_the_lease_is_charged_nothing_more() {
    let (charges, answer) = charges_after_a_crash_and_a_retry(true).await;
    assert_eq!(
        charges.len(),
        1,
        "one charge under the derived key: {charges:?}"
    );
    // The provider recognised the derived key and answered with the
    // first charge, which is what dedupq stored and the client got.
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["id"], format!("ch_{}", charges[0].id));
}

/// The same crash against a provider that ignores idempotency keys: the
/// retry charges again. The window between the charge and the stored
/// result is closed only by the derived key, which both attempts sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_after_a_provider_without_idempotency_charged_the_retry_charges_again() {
    let (charges, answer) = charges_after_a_crash_and_a_retry(false).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(charges.len(), 2, "{charges:?}");
    assert!(
        charges
            .iter()
            .all(|c| c.idempotency_key.as_deref() == Some("acme:pay-crash")),
        "both attempts sent the same derived key: {charges:?}"
    );
}
