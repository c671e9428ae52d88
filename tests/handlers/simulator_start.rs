//! The simulator refuses to start with settings it cannot use, naming them.

use crate::support::{database_url, unique};
use dedupq::provider::{Knobs, LedgerError, ProviderError};
use std::process::Command;
use tokio_util::sync::CancellationToken;

#[test]
fn a_rate_outside_zero_to_one_stops_the_simulator_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .args([
            "provider",
            "--listen",
            "127.0.0.1:0",
            "--slow-after-charge-rate",
            "2",
        ])
        .output()
        .expect("run dedupq provider");

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--slow-after-charge-rate"), "{stderr}");
}

#[tokio::test]
async fn a_schema_holding_an_older_charge_table_is_refused_instead_of_failing_each_charge() {
    let schema = unique("prov_old");
    let pool = sqlx::PgPool::connect(&database_url()).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{schema}\"; \
         CREATE TABLE \"{schema}\".provider_charges (id bigserial PRIMARY KEY, body jsonb NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();

    let served = dedupq::provider::serve(
        listener,
        &database_url(),
        &schema,
        Knobs::default(),
        CancellationToken::new(),
    )
    .await;

    assert!(
        matches!(served, Err(ProviderError::Ledger(LedgerError::OldLayout))),
        "{served:?}"
    );
}
