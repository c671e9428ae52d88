//! Background upkeep of the key table: retention purges, the key gauge and
//! the store's health flag.

use crate::config::RetentionSettings;
use crate::health::{Component, Health};
use crate::metrics::Metrics;
use crate::store::Store;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the store is pinged for /readyz.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How often rows are counted by status (a scan of the finished-keys index:
/// not free on a large table, so not too often).
const COUNT_EVERY: Duration = Duration::from_secs(15);

pub async fn run(
    store: Store,
    retention: RetentionSettings,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) {
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut count = tokio::time::interval(COUNT_EVERY);
    let mut purge = tokio::time::interval(retention.purge_every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ping.tick() => {
                let up = store.ping().await.is_ok();
                health.set(Component::Store, up);
            }
            _ = count.tick() => count_keys(&store, &metrics).await,
            _ = purge.tick() => {
                match store.purge(retention.keep, retention.purge_batch).await {
                    Ok(0) => {}
                    Ok(n) => {
                        metrics.keys_purged.inc_by(n);
                        tracing::info!(purged = n, "retention purge");
                    }
                    Err(e) => {
                        metrics.store_errors.inc();
                        tracing::warn!(error = %e, "retention purge failed");
                    }
                }
            }
        }
    }
}

async fn count_keys(store: &Store, metrics: &Metrics) {
    match store.count_by_status().await {
        Ok(counts) => {
            for (status, n) in counts {
                metrics.keys.with_label_values(&[status.as_str()]).set(n);
            }
        }
        Err(e) => {
            metrics.store_errors.inc();
            tracing::warn!(error = %e, "counting keys failed");
        }
    }
}
