//! A repeat while the first request with its key still runs gets 409,
//! also when that request already charged and is slow or hanging.

use crate::support::process::Provider;
use crate::support::{eventually, unique};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

async fn post(
    provider: &Provider,
    key: &str,
    timeout: Duration,
) -> Result<reqwest::Response, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap()
        .post(provider.charges_url())
        .header("idempotency-key", key)
        .json(&json!({"amount": 5, "currency": "EUR"}))
        .send()
        .await
}

/// Waits until the provider recorded a charge for `key`.
async fn charged(provider: &Provider, key: &str) -> i64 {
    eventually(
        Duration::from_secs(10),
        "the charge is recorded",
        || async { provider.charges_for(key).await.first().map(|c| c.id) },
    )
    .await
}

#[tokio::test]
async fn a_repeat_while_the_first_request_is_slow_after_charging_gets_409_even_after_its_caller_gave_up(
) {
    let provider = Provider::start(Knobs {
        slow_after_charge: Duration::from_secs(2),
        slow_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let key = format!("acme:{}", unique("slow"));

    let first = post(&provider, &key, Duration::from_millis(300)).await;
    let during = post(&provider, &key, Duration::from_secs(5)).await.unwrap();

    assert!(first.unwrap_err().is_timeout(), "the first caller gave up");
    assert_eq!(during.status(), 409);
    let id = charged(&provider, &key).await;
    let replay = eventually(
        Duration::from_secs(10),
        "the slow request finished",
        || async {
            let r = post(&provider, &key, Duration::from_secs(5)).await.ok()?;
            (r.status() == 200).then_some(r)
        },
    )
    .await;
    let replayed: serde_json::Value = replay.json().await.unwrap();
    assert_eq!(replayed["id"], format!("ch_{id}"));
    let charges = provider.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].state, "succeeded");
    assert!(
        charges[0].answered_at.is_none(),
        "its caller never got the answer"
    );
}

#[tokio::test]
async fn a_repeat_while_the_first_request_hangs_after_charging_gets_409_until_its_caller_hangs_up()
{
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let key = format!("acme:{}", unique("hang"));
    let hanging = {
        let (base, key) = (provider.base.clone(), key.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/charges"))
                .header("idempotency-key", key)
                .json(&json!({"amount": 5, "currency": "EUR"}))
                .send()
                .await
        })
    };
    let id = charged(&provider, &key).await;

    let while_waiting = post(&provider, &key, Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still_waiting = post(&provider, &key, Duration::from_secs(5)).await.unwrap();
    hanging.abort();
    let after = eventually(Duration::from_secs(10), "the charge completed", || async {
        let r = post(&provider, &key, Duration::from_secs(5)).await.ok()?;
        (r.status() == 200).then_some(r)
    })
    .await;

    assert_eq!(while_waiting.status(), 409);
    assert_eq!(still_waiting.status(), 409);
    let replayed: serde_json::Value = after.json().await.unwrap();
    assert_eq!(replayed["id"], format!("ch_{id}"));
    assert_eq!(provider.stats().await.charges, 1);
}

#[tokio::test]
async fn a_request_whose_caller_hangs_up_while_the_charge_is_recorded_is_still_charged_and_completes(
) {
    let provider = Provider::start(Knobs::default()).await;
    let key = format!("acme:{}", unique("hangup"));
    // The per-key lock the ledger takes to charge once: held here, the
    // request waits in the middle of recording its charge.
    let admin = sqlx::PgPool::connect(&crate::support::database_url())
        .await
        .unwrap();
    let mut lock = admin.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut *lock)
        .await
        .unwrap();

    let first = post(&provider, &key, Duration::from_millis(300)).await;
    assert!(first.unwrap_err().is_timeout(), "the caller hung up");
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut *lock)
        .await
        .unwrap();

    let charge = eventually(
        Duration::from_secs(10),
        "the charge is recorded and completes",
        || async {
            let charges = provider.charges_for(&key).await;
            charges.first().filter(|c| c.state == "succeeded").cloned()
        },
    )
    .await;
    assert!(
        charge.answered_at.is_none(),
        "its caller never got the answer"
    );
    let replay = post(&provider, &key, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        replay.status(),
        200,
        "a retry is answered, not 409 for ever"
    );
    assert_eq!(provider.charges_for(&key).await.len(), 1);
}
