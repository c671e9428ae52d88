//! A server, database or role whose default lets PostgreSQL acknowledge a
//! commit before it is safe (`synchronous_commit = off`: a crash takes it
//! back; `local`: a failover to a synchronous standby does) never decides
//! how dedupq's own commits are made: every session dedupq opens sets
//! `store.synchronous_commit` (`on` unless configured stronger), so an
//! outcome stored, and its message committed or acked, stays stored.

use crate::support::pg_faults::FaultyRole;
use dedupq::config::{StoreSettings, SynchronousCommit};
use dedupq::store::Store;
use sqlx::PgPool;

async fn synchronous_commit(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(pool)
        .await
        .expect("read synchronous_commit")
}

/// With the role's default at `default`, what a plain session of the role
/// and dedupq's sessions (configured with `level`) commit with.
async fn sessions_with(default: &str, level: SynchronousCommit) -> (String, String) {
    let role = FaultyRole::create().await;
    role.set("synchronous_commit", Some(default)).await;
    let plain = PgPool::connect(&role.url()).await.expect("plain session");
    let settings = StoreSettings {
        synchronous_commit: level,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&role.store_settings(&settings)).expect("store");
    let seen = (
        synchronous_commit(&plain).await,
        synchronous_commit(store.pool()).await,
    );
    plain.close().await;
    store.pool().close().await;
    role.set("synchronous_commit", None).await;
    role.drop().await;
    seen
}

#[tokio::test]
async fn a_role_that_commits_without_flushing_still_gets_durable_commits_from_dedupq() {
    let (plain, dedupq) = sessions_with("off", SynchronousCommit::On).await;
    assert_eq!(
        plain, "off",
        "the role's own default, as any other client gets it"
    );
    assert_eq!(dedupq, "on", "dedupq's sessions must not inherit `off`");
}

#[tokio::test]
async fn a_role_that_skips_the_synchronous_standby_still_waits_for_it_in_dedupqs_sessions() {
    let (plain, dedupq) = sessions_with("local", SynchronousCommit::On).await;
    assert_eq!(plain, "local");
    assert_eq!(dedupq, "on");
}

#[tokio::test]
async fn a_stronger_level_configured_in_store_synchronous_commit_is_the_one_used() {
    let (plain, dedupq) = sessions_with("off", SynchronousCommit::RemoteApply).await;
    assert_eq!(plain, "off");
    assert_eq!(dedupq, "remote_apply");
}
