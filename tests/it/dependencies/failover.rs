//! A real PostgreSQL failover: a primary with a synchronous streaming
//! standby, the primary killed at once while payments are charged and
//! stored, the address dedupq connects to moved to the standby (as a
//! virtual IP or a DNS name moves), the standby promoted two seconds
//! later. Every payment is charged once and stored `done` with the
//! provider's own answer on the new primary; nothing is dead-lettered.

use super::common::{body, nothing_given_up, KafkaRun, TENANT};
use crate::support::eventually;
use crate::support::forward::forward;
use crate::support::pg_pair::PgPair;
use crate::support::process::{base_config, free_port, Provider};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq_provider::Knobs;
use std::collections::BTreeMap;
use std::time::Duration;

const N: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payments_charged_across_a_failover_to_the_synchronous_standby_are_stored_once_each() {
    let pair = PgPair::start().await;
    let address = |port: u16| format!("127.0.0.1:{port}");
    let port = free_port();
    let vip = forward(port, address(pair.primary_port)).await;
    let store = StoreSettings {
        url: SecretUrl::new(pair.url(port)),
        ..StoreSettings::default()
    };
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(40),
        ..Knobs::default()
    })
    .await;
    let run = KafkaRun::start("failover", 2, &base_config(&store, &provider)).await;

    let feed = crate::support::kafka::paced_payments(
        &run.topic,
        2,
        TENANT,
        N,
        Duration::from_millis(20),
        |n| body(n).into_bytes(),
    );
    eventually(Duration::from_secs(60), "a third charged", || async {
        (provider.stats().await.charges >= (N / 3) as i64).then_some(())
    })
    .await;
    {
        let pair = &pair;
        tokio::task::block_in_place(|| pair.crash_primary());
    }
    vip.point_at(address(pair.standby_port));
    // Meanwhile the standby takes sessions but no writes (25006).
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| pair.promote_standby());
    feed.await.expect("producer task");

    run.wait_committed_to_end(Duration::from_secs(120)).await;
    provider.charged_once_each(N).await;
    let metrics = nothing_given_up(&run.dedupq).await;
    let errors = |class: &str| {
        crate::support::process::metric_value(
            &metrics,
            &format!(r#"dedupq_store_errors_total{{class="{class}"}}"#),
        )
    };
    assert!(
        errors("connection") > 0.0 && errors("25") > 0.0,
        "dedupq met the dead primary and the standby before its promotion: \
         connection {}, read-only {}",
        errors("connection"),
        errors("25")
    );

    // What the new primary stores is what the provider did.
    let promoted = sqlx::PgPool::connect(&pair.url(pair.standby_port))
        .await
        .expect("connect to the promoted standby");
    let rows: Vec<(String, String, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT key, status, result_body FROM dedupq_keys WHERE tenant = $1")
            .bind(TENANT)
            .fetch_all(&promoted)
            .await
            .expect("read the key table");
    let stored: BTreeMap<String, (String, Option<Vec<u8>>)> =
        rows.into_iter().map(|(k, s, b)| (k, (s, b))).collect();
    assert_eq!(stored.len(), N, "one row per payment");
    for n in 0..N {
        let key = format!("pay-{n}");
        let (status, body) = &stored[&key];
        assert_eq!(status, "done", "{key}");
        let charges = provider.charges_for(&format!("{TENANT}:{key}")).await;
        assert_eq!(charges.len(), 1, "{key}: one charge");
        let answer: serde_json::Value =
            serde_json::from_slice(body.as_deref().unwrap_or_default()).expect("stored JSON");
        assert_eq!(
            answer["id"],
            format!("ch_{}", charges[0].id),
            "{key}: the charge made"
        );
    }
}
