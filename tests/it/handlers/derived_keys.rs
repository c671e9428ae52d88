//! `identity.derived_key = "sha256:40"`: the provider receives a key of 40
//! hex digits (no `:`, within providers' length limits), the same on every
//! attempt; and a change of format never changes the key of a payment
//! already claimed. Through Kafka, against the simulator.

use crate::support::payments::{KafkaPayments, Setup, TENANT, WAIT};
use crate::support::process::Provider;
use crate::support::{eventually, http_handler, isolated_store};
use dedupq::config::IdentitySettings;
use dedupq::engine::Outcome;
use dedupq::fingerprint::hex;
use dedupq::store::{KeyStatus, Store};
use dedupq_provider::Knobs;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

const BODY: &str = r#"{"amount":640,"currency":"EUR"}"#;

/// The key the provider should see: SHA-256 of `tenant:key`, 40 hex digits.
fn hashed(key: &str) -> String {
    let mut h = hex(&Sha256::digest(format!("{TENANT}:{key}").as_bytes()));
    h.truncate(40);
    h
}

fn hashed_setup(provider: &Provider) -> Setup {
    let mut setup = Setup::new(http_handler(
        &provider.charges_url(),
        Duration::from_millis(700),
    ));
    setup.identity = IdentitySettings {
        derived_key: "sha256:40".into(),
        ..IdentitySettings::default()
    };
    setup
}

/// Waits until no charge of the provider is still running.
async fn charges_completed(provider: &Provider, key: &str) {
    eventually(WAIT, "the provider completed its charges", || async {
        let charges = provider.charges_for(key).await;
        charges.iter().all(|c| c.state != "pending").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hashed_derived_key_is_40_hex_digits_and_the_same_on_every_attempt() {
    // The first attempt charges and never answers: the retry must be
    // recognised by the provider as the same payment.
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let pipeline = KafkaPayments::start(hashed_setup(&provider)).await;

    pipeline.send("hashed-1", BODY.as_bytes(), &[]).await;
    let row = pipeline.wait_status("hashed-1", KeyStatus::Done).await;

    let key = hashed("hashed-1");
    assert_eq!(key.len(), 40);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(row.derived_key.as_deref(), Some(key.as_str()));
    assert!(row.attempts >= 2, "retried: {row:?}");
    let charges = provider.charges_for(&key).await;
    assert_eq!(charges.len(), 1, "one charge under the hashed key");
    assert_eq!(row.result_status, Some(200), "the retry got the replay");
    assert_eq!(provider.stats().await.charges, 1);
    pipeline.stop().await;
}

/// `acme:switch-1` claimed under the plain format, its outcome unknown;
/// then the deployment switches to `sha256:40` and a copy arrives.
async fn switched_format(forget_stored_key: bool) -> (Provider, Store, KeyStatus) {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, store_settings) = isolated_store().await;
    let plain = crate::support::engine(
        &store,
        Arc::new(http_handler(
            &provider.charges_url(),
            Duration::from_millis(700),
        )),
        crate::support::fast_options(),
    );
    let d = plain
        .process(&[crate::support::message(TENANT, "switch-1", BODY)])
        .await
        .unwrap();
    assert_eq!(d[0].outcome, Outcome::Unknown);
    charges_completed(&provider, "acme:switch-1").await;
    if forget_stored_key {
        sqlx::query("UPDATE dedupq_keys SET derived_key = NULL")
            .execute(store.pool())
            .await
            .unwrap();
    }

    let pipeline =
        KafkaPayments::start_on(store.clone(), store_settings, hashed_setup(&provider)).await;
    pipeline.send("switch-1", BODY.as_bytes(), &[]).await;
    let row = pipeline
        .wait_row("switch-1", "the copy was handled", |r| {
            r.status == KeyStatus::Done
        })
        .await;
    pipeline.stop().await;
    (provider, store, row.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_derived_key_format_does_not_change_the_key_of_a_payment_already_claimed() {
    let (provider, _store, status) = switched_format(false).await;

    assert_eq!(status, KeyStatus::Done);
    assert_eq!(provider.charges_for("acme:switch-1").await.len(), 1);
    assert!(provider.charges_for(&hashed("switch-1")).await.is_empty());
    assert_eq!(provider.stats().await.charges, 1);
}

/// A store that does not keep the derived key: the copy is sent under
/// the new format, which the provider has never seen — a second charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_derived_key_recomputed_after_the_switch_is_caught_charging_twice() {
    let (provider, _store, _) = switched_format(true).await;

    assert_eq!(provider.charges_for(&hashed("switch-1")).await.len(), 1);
    assert_eq!(provider.stats().await.charges, 2, "charged twice");
}
