//! A real PostgreSQL failover: a primary with a synchronous streaming
//! standby, the primary killed at once while payments are charged and
//! stored, the address dedupq connects to moved to the standby (as a
//! virtual IP or a DNS name moves), the standby promoted two seconds
//! later. Every payment is charged once and stored `done` with the
//! provider's own answer on the new primary; nothing is dead-lettered.

use super::common::{body, nothing_given_up, KafkaRun, TENANT};
use crate::support::eventually;
use crate::support::forward::Moving;
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
    let vip = Moving::start(port, address(pair.primary_port)).await;
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

    let feed = {
        let (topic, producer) = (run.topic.clone(), crate::support::kafka::producer());
        tokio::spawn(async move {
            for n in 0..N {
                crate::support::kafka::produce(
                    &producer,
                    &topic,
                    (n % 2) as i32,
                    &crate::support::kafka::headers(TENANT, &format!("pay-{n}")),
                    body(n).as_bytes(),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
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
    let stats = provider.stats().await;
    assert_eq!(stats.charges, N as i64, "every payment charged once");
    assert_eq!(stats.keys, N as i64);
    assert_eq!(stats.double_charged, 0);
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
