//! How the engine's key-table statements fare: failures are counted by
//! SQLSTATE class and reported on /readyz while writes fail, and a write
//! whose result is only in memory is retried through an outage.

use crate::backoff::{self, Backoff, Gave};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::StoreError;
use std::future::Future;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub(super) struct StoreWatch {
    metrics: Metrics,
    health: Health,
    backoff: Backoff,
    shutdown: CancellationToken,
}

impl StoreWatch {
    pub(super) fn new(
        metrics: Metrics,
        health: Health,
        backoff: Backoff,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            metrics,
            health,
            backoff,
            shutdown,
        }
    }

    /// Counts a failed key-table statement by its SQLSTATE class, and tells
    /// /readyz that writes fail (with the SQLSTATE) while they do.
    pub(super) fn failed(&self, e: &StoreError) {
        self.metrics.store_error(e);
        if e.is_transient() {
            self.health.store_writes_failed(e);
        }
    }

    /// A key-table write went through: writes work again.
    pub(super) fn worked(&self) {
        self.health.store_writes_work();
    }

    /// Retries a store write through an outage: the result is only in
    /// memory, so it is worth waiting for PostgreSQL to come back, however
    /// long (read-only after a failover, timeouts, out of disk). Gives up
    /// on shutdown (nothing is committed; the message comes back) or on an
    /// error that belongs to the row (see [`StoreError`]).
    pub(super) async fn retry<T, F, Fut>(&self, write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let got = backoff::wait_out(
            self.backoff,
            &self.shutdown,
            StoreError::is_transient,
            |e, attempt, _| {
                self.failed(e);
                tracing::warn!(error = %crate::telemetry::chain(e), attempt, "store write failed; retrying");
            },
            write,
        )
        .await
        .map_err(|gave| {
            if let Gave::Up(e) = &gave {
                self.failed(e);
            }
            gave.into_inner()
        });
        if got.is_ok() {
            self.worked();
        }
        got
    }
}
