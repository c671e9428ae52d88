//! PostgreSQL over TLS with `sslmode=verify-full`: the server certificate
//! must chain to `sslrootcert` and name the host.

use crate::support::endpoints::endpoints;
use crate::support::unique;
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::store::{Store, StoreError};

fn settings(url: String) -> StoreSettings {
    StoreSettings {
        url: SecretUrl::new(url),
        schema: Some(unique("tls")),
        ..StoreSettings::default()
    }
}

async fn connection_uses_tls(store: &Store) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

#[tokio::test]
async fn the_store_migrates_and_works_over_verify_full_tls() {
    let ep = endpoints();
    for url in [
        ep.get("DATABASE_TLS_URL"),
        ep.get("DATABASE_TLS_URL").replace("127.0.0.1", "localhost"),
    ] {
        let s = settings(url);
        let store = Store::connect_lazy(&s).unwrap();
        store.migrate(s.schema.as_deref()).await.unwrap();
        store.check_migrated(s.schema.as_deref()).await.unwrap();
        assert!(connection_uses_tls(&store).await);
    }
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let ep = endpoints();
    let url = ep.get("DATABASE_TLS_URL").replace(&ep.ca(), &ep.other_ca());
    let s = settings(url);
    let store = Store::connect_lazy(&s).unwrap();
    let e = store.migrate(s.schema.as_deref()).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    let chain = format!("{:?}", e);
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");
}
