use crate::support::{self, handlers::Recording};
use dedupq::config::StoreSettings;
use dedupq::engine::Parser;
use dedupq::store::{ClaimRequest, KeyStatus};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

fn keys(store: &StoreSettings, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .arg("keys")
        .args(args)
        .env("DEDUPQ__STORE__URL", store.url.expose())
        .env("DEDUPQ__STORE__SCHEMA", store.schema.as_deref().unwrap())
        .env("USER", "oncall")
        .output()
        .expect("run dedupq keys");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn keys_show_list_release_and_purge_work_against_the_real_table() {
    let (store, settings) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    engine
        .process(&[support::message("acme", "paid", r#"{"amount": 1}"#)])
        .await
        .unwrap();
    // A key left behind by a crashed worker, lease already over.
    let stuck = support::message("acme", "stuck", r#"{"amount": 2}"#);
    let parsed = Parser::new(&Default::default()).parse(&stuck).unwrap();
    store
        .claim_batch(
            &[ClaimRequest {
                identity: &parsed.identity,
                fingerprint: &parsed.fingerprint,
                body: &stuck.body,
                content_type: None,
                derived_key: &parsed.derived_key,
                route: None,
            }],
            "crashed",
            Duration::from_millis(1),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let (code, out, _) = keys(&settings, &["show", "acme", "paid"]);
    assert_eq!(code, 0);
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["status"], "done");
    assert_eq!(shown["result_body"]["tenant"], "acme");

    let (code, out, _) = keys(&settings, &["list"]);
    assert_eq!(code, 0);
    let listed: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "only the stuck key: {out}");
    assert_eq!(listed[0]["key"], "stuck");
    assert_eq!(listed[0]["owner"], "crashed");

    let (code, out, _) = keys(&settings, &["list", "--status", "done"]);
    assert_eq!((code, out.lines().count()), (0, 1));

    let (code, out, err) = keys(
        &settings,
        &["release", "acme", "stuck", "--reason", "INC-42 worker gone"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released acme/stuck"), "{out}");
    let audit: (String, String, String, serde_json::Value) =
        sqlx::query_as("SELECT action, reason, actor, before FROM dedupq_key_audit WHERE tenant = 'acme' AND key = 'stuck'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        (audit.0.as_str(), audit.1.as_str(), audit.2.as_str()),
        ("release", "INC-42 worker gone", "oncall")
    );
    assert_eq!(audit.3["owner"], "crashed");

    // `keys audit` shows the same line, as JSON and as a table.
    let (code, out, err) = keys(
        &settings,
        &["audit", "--tenant", "acme", "--output", "json"],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(
        (
            &lines[0]["key"],
            &lines[0]["action"],
            &lines[0]["reason"],
            &lines[0]["actor"]
        ),
        (
            &serde_json::json!("stuck"),
            &serde_json::json!("release"),
            &serde_json::json!("INC-42 worker gone"),
            &serde_json::json!("oncall")
        )
    );
    assert_eq!(lines[0]["before"]["owner"], "crashed");
    let (code, table, _) = keys(&settings, &["audit", "--output", "table"]);
    assert_eq!(code, 0);
    assert!(table.starts_with("AT"), "{table}");
    assert!(table.contains("INC-42 worker gone"), "{table}");
    let (_, none, _) = keys(
        &settings,
        &["audit", "--tenant", "globex", "--output", "json"],
    );
    assert!(none.trim().is_empty(), "another tenant's lines: {none}");

    let (code, _, err) = keys(&settings, &["release", "acme", "paid", "--reason", "x"]);
    assert_ne!(code, 0, "a finished key cannot be released");
    assert!(err.contains("not open"), "{err}");

    sqlx::query(
        "UPDATE dedupq_keys SET created_at = now() - interval '3 days', \
         completed_at = now() - interval '3 days' WHERE key = 'paid'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let (code, out, _) = keys(&settings, &["purge", "--older-than", "2d"]);
    assert_eq!(code, 0);
    assert!(out.contains("purged 1 "), "{out}");
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(
        row.status,
        KeyStatus::InProgress,
        "open keys survive purges"
    );

    let (code, _, err) = keys(&settings, &["show", "acme", "bad key"]);
    assert_ne!(code, 0);
    assert!(err.contains("visible ASCII"), "{err}");
}
