//! The simulator refuses a schema it cannot use (its flags are checked in
//! provider/tests/cli.rs).

use crate::support::{database_url, unique};
use dedupq_provider::{Knobs, LedgerError, ProviderError};
use tokio_util::sync::CancellationToken;

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

    let served = dedupq_provider::serve(
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
