//! Two `dedupq run` processes on one key table: exactly one purges and
//! counts keys; SIGKILL it and the other takes over.

use crate::support::{self, process::Dedupq, process::Provider};
use dedupq::store::Store;
use dedupq_provider::Knobs;
use std::time::Duration;

/// Finished rows completed three hours ago: past `retention.keep` below.
async fn old_done_rows(store: &Store, prefix: &str, n: i32) {
    sqlx::query(
        "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, epoch, \
         owner, attempts, created_at, completed_at) \
         SELECT 'acme', $1 || g, '\\x00', 1, 'done', 1, 'gone', 1, \
                now() - interval '3 hours', now() - interval '3 hours' \
         FROM generate_series(1, $2) AS g",
    )
    .bind(prefix)
    .bind(n)
    .execute(store.pool())
    .await
    .expect("insert old rows");
}

async fn old_rows_left(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE owner = 'gone'")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// (leader flag, keys purged, whether it exports the key gauges) of one process.
async fn upkeep(p: &Dedupq) -> (f64, f64, bool) {
    let text = p.metrics().await;
    let v = |s: &str| support::process::metric_value(&text, s);
    (
        v("dedupq_upkeep_leader"),
        v("dedupq_keys_purged_total"),
        text.contains("dedupq_keys{"),
    )
}

#[tokio::test]
async fn one_replica_purges_and_counts_and_another_takes_over_when_it_is_killed() {
    let (store, settings) = support::isolated_store().await;
    old_done_rows(&store, "first-", 3).await;
    let provider = Provider::start(Knobs::default()).await;
    let mut config = support::process::base_config(&settings, &provider);
    let retention: toml::Table =
        "keep = \"2h\"\nredelivery_horizon = \"1h\"\npurge_every = \"500ms\""
            .parse()
            .unwrap();
    config.insert("retention".into(), toml::Value::Table(retention));
    let mut a = Dedupq::start(&config).await;
    let mut b = Dedupq::start(&config).await;

    let (leader, standby) =
        support::eventually(Duration::from_secs(30), "one leader purged", || async {
            let (ua, ub) = (upkeep(&a).await, upkeep(&b).await);
            match (ua.0, ub.0) {
                (1.0, 0.0) if ua.1 == 3.0 => Some(("a", ub)),
                (0.0, 1.0) if ub.1 == 3.0 => Some(("b", ua)),
                _ => None,
            }
        })
        .await;
    assert_eq!(old_rows_left(&store).await, 0);
    assert_eq!(standby.1, 0.0, "the standby purged nothing");
    assert!(!standby.2, "the standby exports no key-table gauges");
    // Leadership holds still: both replicas sampled a few times.
    for _ in 0..5 {
        let (ua, ub) = (upkeep(&a).await, upkeep(&b).await);
        assert_eq!(ua.0 + ub.0, 1.0, "exactly one leader at a time");
        assert_eq!(ua.2, ua.0 == 1.0, "only the leader exports dedupq_keys");
        assert_eq!(ub.2, ub.0 == 1.0, "only the leader exports dedupq_keys");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let (killed, survivor) = if leader == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    killed.kill();
    support::eventually(Duration::from_secs(30), "the standby took over", || async {
        (upkeep(survivor).await.0 == 1.0).then_some(())
    })
    .await;
    // Rows only after the takeover: a purge the killed leader had already
    // written to its socket can still run in PostgreSQL after the kill, and
    // would take rows inserted then.
    old_done_rows(&store, "second-", 2).await;
    support::eventually(
        Duration::from_secs(30),
        "the new leader purged and counts",
        || async {
            let u = upkeep(survivor).await;
            (u.0 == 1.0 && u.1 == 2.0 && u.2).then_some(())
        },
    )
    .await;
    assert_eq!(old_rows_left(&store).await, 0);
    assert_eq!(
        survivor.metric("dedupq_ready").await,
        1.0,
        "the survivor is ready"
    );
}
