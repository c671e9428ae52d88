//! `store.schema` reaches PostgreSQL in the connection's startup options
//! (`-c search_path=…`), which nobody quotes: a plain identifier is
//! accepted and quoted (its case kept), anything else is refused.

use crate::support::{self, unique};
use dedupq::config::{SecretUrl, Settings, StoreSettings};
use dedupq::store::{Store, StoreError};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::str::FromStr;

fn store_settings(schema: &str) -> StoreSettings {
    StoreSettings {
        url: SecretUrl::new(support::database_url()),
        schema: Some(schema.to_string()),
        ..StoreSettings::default()
    }
}

#[tokio::test]
async fn a_mixed_case_schema_keeps_its_case_and_holds_the_key_table() {
    let schema = format!("Pay_EU_{}", unique("X"));
    let s = store_settings(&schema);
    let store = Store::connect_lazy(&s).unwrap();
    store.migrate(Some(&schema)).await.unwrap();
    let engine = support::engine(
        &store,
        std::sync::Arc::new(support::handlers::Recording::default()),
        support::fast_options(),
    );
    engine
        .process(&[support::message("acme", "k1", r#"{"amount":1}"#)])
        .await
        .unwrap();

    let (namespace, rows): (String, i64) = sqlx::query_as(
        "SELECT n.nspname::text, (SELECT count(*) FROM dedupq_keys)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.oid = 'dedupq_keys'::regclass",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        namespace, schema,
        "the table lives in the schema, case kept"
    );
    assert_eq!(rows, 1);
}

#[test]
fn a_schema_with_a_comma_or_a_space_is_refused_at_start_up_naming_the_setting() {
    for bad in [
        "payments,public",
        "payments -c default_transaction_read_only=on",
        "pay\"ments",
    ] {
        let settings = Settings {
            store: store_settings(bad),
            ..Settings::default()
        };
        let e = settings.validate().unwrap_err();
        assert_eq!(e.setting, "store.schema", "{bad}: {e}");

        let e = Store::connect_lazy(&settings.store).unwrap_err();
        assert!(matches!(e, StoreError::SchemaName { .. }), "{bad}: {e:?}");
    }
}

/// What the check prevents: spliced unquoted into the startup options, a
/// space in the schema name starts a setting of the attacker's choice.
#[tokio::test]
async fn spliced_unquoted_a_schema_name_injects_a_setting() {
    let options = PgConnectOptions::from_str(&support::database_url())
        .unwrap()
        .options([("search_path", "x -c default_transaction_read_only=on")]);
    let mut conn = options.connect().await.unwrap();
    let read_only: String = sqlx::query_scalar("SHOW default_transaction_read_only")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    assert_eq!(read_only, "on");
}
