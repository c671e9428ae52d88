//! Instances started together on a fresh `store.schema` used to race on
//! `CREATE SCHEMA IF NOT EXISTS` (one exited with a duplicate key on
//! pg_namespace). The schema and the migrations are now made under an
//! advisory lock; built with `broken-no-migrate-lock`, this test fails.

use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::provider::Knobs;
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
