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
/// How often open keys (in_progress, unknown) are counted: cheap.
const COUNT_OPEN_EVERY: Duration = Duration::from_secs(15);
/// How often finished keys are counted: a scan of most of the table, which
/// on tens of millions of rows costs seconds of a core.
const COUNT_FINISHED_EVERY: Duration = Duration::from_secs(600);

pub async fn run(
    store: Store,
    retention: RetentionSettings,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) {
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut count_open = tokio::time::interval(COUNT_OPEN_EVERY);
    let mut count_finished = tokio::time::interval(COUNT_FINISHED_EVERY);
    let mut purge = tokio::time::interval(retention.purge_every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ping.tick() => {
                let up = store.ping().await.is_ok();
                health.set(Component::Store, up);
            }
            _ = count_open.tick() => record_counts(store.count_open().await, &metrics),
            _ = count_finished.tick() => record_counts(store.count_finished().await, &metrics),
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

fn record_counts(
    counts: Result<Vec<(crate::store::KeyStatus, i64)>, crate::store::StoreError>,
    metrics: &Metrics,
) {
    match counts {
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
