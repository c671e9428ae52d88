//! Instances started together on a fresh `store.schema` used to race on
//! `CREATE SCHEMA IF NOT EXISTS` (one exited with a duplicate key on
//! pg_namespace). The schema and the migrations are now made under an
//! advisory lock; with `DEDUPQ_BROKEN=no-migrate-lock` (a `broken` build),
//! these tests fail: the last one every time, the others when the race
//! lines up.

use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::store::{Store, MIGRATE_LOCK};
use dedupq_provider::Knobs;
use sqlx::{Connection, Executor, PgConnection};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_started_at_once_on_a_fresh_schema_all_come_up_ten_times() {
    let provider = Provider::start(Knobs::default()).await;
    for round in 1..=10 {
        let store = StoreSettings {
            url: SecretUrl::new(support::database_url()),
            schema: Some(unique("race")),
            ..StoreSettings::default()
        };
        let config = base_config(&store, &provider);
        let mut fleet: Vec<Dedupq> = (0..4).map(|_| Dedupq::launch(&config, &[])).collect();
        for (i, dedupq) in fleet.iter_mut().enumerate() {
            if let Err(log) = dedupq.wait_ready(Duration::from_secs(60)).await {
                panic!("round {round}, instance {i}: {log}");
            }
        }
        for dedupq in &mut fleet {
            dedupq.kill();
        }
    }
}

/// The same race without process start-up in between: eight stores, each
/// with a connection already open, migrate one fresh schema at the same
/// instant, twenty times. Without the lock two of them create the schema
/// together and one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_migrating_one_fresh_schema_at_the_same_instant_all_succeed() {
    for round in 1..=20 {
        let settings = StoreSettings {
            url: SecretUrl::new(support::database_url()),
            schema: Some(unique("race")),
            max_connections: 2,
            ..StoreSettings::default()
        };
        let mut stores = Vec::new();
        for _ in 0..8 {
            let store = dedupq::store::Store::connect_lazy(&settings).unwrap();
            drop(store.pool().acquire().await.unwrap());
            stores.push(store);
        }
        let start = tokio::sync::Barrier::new(stores.len());
        let runs = stores.iter().map(|store| async {
            start.wait().await;
            store.migrate(settings.schema.as_deref()).await
        });
        for (i, ran) in futures::future::join_all(runs)
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = ran {
                panic!("round {round}, store {i}: {}", dedupq::telemetry::chain(&e));
            }
        }
    }
}

/// The race held open: another instance holds the migration lock and has
/// created the schema in a transaction it has not committed yet. A store
/// that migrates meanwhile waits for the lock; once the other commits, it
/// finds the schema and applies its migrations. Without the lock, its
/// `CREATE SCHEMA IF NOT EXISTS` waits on the other's row of pg_namespace
/// instead and fails with a duplicate key when that commits: every time,
/// not only when a race happens to line up.
#[tokio::test]
async fn a_store_migrating_while_another_instance_creates_the_schema_waits_for_it() {
    let schema = unique("race");
    let settings = StoreSettings {
        url: SecretUrl::new(support::database_url()),
        schema: Some(schema.clone()),
        // One connection: the migration runs on the session whose pid
        // is read here.
        max_connections: 1,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings).unwrap();
    let pid: i32 = {
        let mut conn = store.pool().acquire().await.unwrap();
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    // The other instance, midway through its migration.
    let mut other = PgConnection::connect(&support::database_url())
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    other.execute("BEGIN").await.unwrap();
    other
        .execute(format!("CREATE SCHEMA \"{schema}\"").as_str())
        .await
        .unwrap();

    // The other instance commits once the migrating session waits for a
    // lock; the migration runs beside that, in this task.
    let watch = sqlx::PgPool::connect(&support::database_url())
        .await
        .unwrap();
    let other_commits = async {
        support::eventually(
            Duration::from_secs(30),
            "the migrating session waiting for a lock",
            || async {
                let waiting: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)",
                )
                .bind(pid)
                .fetch_one(&watch)
                .await
                .unwrap();
                waiting.then_some(())
            },
        )
        .await;
        other.execute("COMMIT").await.unwrap();
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATE_LOCK)
            .execute(&mut other)
            .await
            .unwrap();
    };
    let (migrated, ()) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(store.migrate(Some(&schema)), other_commits)
    })
    .await
    .expect("the migration ends once the other instance is done");
    watch.close().await;
    if let Err(e) = migrated {
        panic!(
            "migrating beside the other instance: {}",
            dedupq::telemetry::chain(&e)
        );
    }
    let pending = store.pending_migrations(Some(&schema)).await.unwrap();
    assert!(pending.is_empty(), "migrations left: {pending:?}");
}
