//! Instances started together on a fresh `store.schema` used to race on
//! `CREATE SCHEMA IF NOT EXISTS` (one exited with a duplicate key on
//! pg_namespace). The schema and the migrations are now made under an
//! advisory lock; with `DEDUPQ_BROKEN=no-migrate-lock` (a `broken` build),
//! this test fails.

use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq_provider::Knobs;
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
