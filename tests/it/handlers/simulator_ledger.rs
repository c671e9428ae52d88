//! The simulator's ledger for reconciliation and checks: the lookup by
//! key, forgetting keys, and per-key counts to compare with dedupq's keys.

use crate::support::process::Provider;
use dedupq_provider::{Knobs, DECLINED_CARD};
use serde_json::json;
use std::time::Duration;

const JSON: &str = "application/json";

#[tokio::test]
async fn the_lookup_answers_what_a_retry_would_without_charging() {
    let provider = Provider::start(Knobs::default()).await;
    let declined = json!({"amount": 2, "card": DECLINED_CARD}).to_string();

    let unknown = provider.lookup("acme:none").await;
    let charge = provider.post_raw("acme:ok", JSON, br#"{"amount":1}"#).await;
    let charged = charge.bytes().await.unwrap();
    let decline = provider
        .post_raw("acme:no", JSON, declined.as_bytes())
        .await;
    let decline = decline.bytes().await.unwrap();
    let found = provider.lookup("acme:ok").await;
    let refused = provider.lookup("acme:no").await;

    assert_eq!(unknown.status(), 404);
    assert_eq!(found.status(), 200);
    assert_eq!(
        found.bytes().await.unwrap(),
        charged,
        "the body the POST answered"
    );
    assert_eq!(refused.status(), 402);
    assert_eq!(refused.bytes().await.unwrap(), decline);
    let stats = provider.stats().await;
    assert_eq!(
        (stats.charges, stats.declined),
        (1, 1),
        "lookups charge nothing"
    );
}

/// A charge of 1 with `key`, posted from a task of its own, once the
/// provider has recorded it (its answer may still be on its way).
async fn charge_recorded(
    provider: &Provider,
    key: &'static str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let url = provider.charges_url();
    let running = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", key)
            .json(&json!({"amount": 1}))
            .send()
            .await
    });
    crate::support::eventually(
        Duration::from_secs(10),
        "the charge is recorded",
        || async { (!provider.charges_for(key).await.is_empty()).then_some(()) },
    )
    .await;
    running
}

#[tokio::test]
async fn the_lookup_of_a_key_whose_request_still_runs_is_409() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(2),
        ..Knobs::default()
    })
    .await;
    let running = charge_recorded(&provider, "acme:slow").await;

    let during = provider.lookup("acme:slow").await;
    let answered = running.await.unwrap().unwrap();
    let after = provider.lookup("acme:slow").await;

    assert_eq!(during.status(), 409);
    assert_eq!(answered.status(), 201);
    assert_eq!(after.status(), 200);
}

/// A charge made while the ledger cannot record its completion (the
/// simulator's database restarting, as in a chaos run beside a PostgreSQL
/// restart) completes once it can: it does not stay running, answering
/// every repeat 409 for good.
#[tokio::test]
async fn a_charge_whose_completion_cannot_be_written_at_first_completes_once_it_can() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(300),
        ..Knobs::default()
    })
    .await;
    let db = sqlx::PgPool::connect(&crate::support::database_url())
        .await
        .expect("connect");
    let schema = &provider.schema;
    sqlx::raw_sql(&format!(
        r#"CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'the ledger cannot be written'; END $$;
           CREATE TRIGGER refuse BEFORE UPDATE ON "{schema}".provider_charges
             FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION "{schema}".refuse();"#
    ))
    .execute(&db)
    .await
    .expect("a trigger refusing completions");
    let running = charge_recorded(&provider, "acme:refused").await;
    // Past the latency: the completion has been refused at least once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(provider.lookup("acme:refused").await.status(), 409);

    sqlx::raw_sql(&format!(
        r#"DROP TRIGGER refuse ON "{schema}".provider_charges"#
    ))
    .execute(&db)
    .await
    .expect("drop the trigger");
    let answered = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("answered once the ledger can be written")
        .unwrap()
        .unwrap();
    assert_eq!(answered.status(), 201);
    assert_eq!(provider.lookup("acme:refused").await.status(), 200);
    assert_eq!(provider.charges_for("acme:refused").await.len(), 1);
}

#[tokio::test]
async fn after_the_provider_forgets_its_keys_a_retry_charges_again_and_the_ledger_shows_both() {
    let provider = Provider::start(Knobs::default()).await;
    let body = br#"{"payment_id":"p-1","amount":1}"#;

    let first = provider.post_raw("acme:p-1", JSON, body).await;
    let forgotten = provider.forget_keys().await;
    let lookup_after_forgetting = provider.lookup("acme:p-1").await;
    let again = provider.post_raw("acme:p-1", JSON, body).await;

    assert_eq!(
        (first.status().as_u16(), again.status().as_u16()),
        (201, 201),
        "charged again"
    );
    assert_eq!(forgotten, 1);
    assert_eq!(lookup_after_forgetting.status(), 404);
    let stats = provider.stats().await;
    assert_eq!((stats.charges, stats.double_charged), (2, 1));
    let keys = provider.key_charges(Some("acme")).await;
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].charged, 2);
    let remembered: Vec<bool> = keys[0].charges.iter().map(|c| c.remembered).collect();
    assert_eq!(remembered, [false, true]);
}

#[tokio::test]
async fn per_key_counts_name_each_keys_charges_for_comparison_with_dedupqs_key_table() {
    let provider = Provider::start(Knobs {
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let declined = json!({"amount": 3, "card": DECLINED_CARD}).to_string();
    for (key, body) in [
        ("acme:a", br#"{"amount":1}"#.as_slice()),
        ("acme:a", br#"{"amount":1}"#.as_slice()),
        ("acme:b", br#"{"amount":2}"#.as_slice()),
        ("globex:a", declined.as_bytes()),
    ] {
        provider.post_raw(key, JSON, body).await;
    }

    let acme = provider.key_charges(Some("acme")).await;
    let all = provider.key_charges(None).await;

    let summary: Vec<(String, String, i64, Vec<String>)> = all
        .iter()
        .map(|k| {
            let states = k.charges.iter().map(|c| c.state.clone()).collect();
            (
                k.tenant.clone().unwrap(),
                k.key.clone().unwrap(),
                k.charged,
                states,
            )
        })
        .collect();
    let s = |v: &str| v.to_string();
    assert_eq!(
        summary,
        [
            (s("acme"), s("a"), 2, vec![s("succeeded"), s("succeeded")]),
            (s("acme"), s("b"), 1, vec![s("succeeded")]),
            (s("globex"), s("a"), 0, vec![s("declined")]),
        ]
    );
    assert_eq!(acme.len(), 2);
    assert!(acme[0].charges.iter().all(|c| c.id.starts_with("ch_")));
}
