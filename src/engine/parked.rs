//! Outcomes whose row another transaction holds. The provider's answer is
//! never dropped: it is kept here, with the claim's lease renewed, and
//! written as soon as the row is free. The message meanwhile goes back to
//! its transport uncommitted and, when it comes again, finds the key held
//! (by this lease) or stored.

use super::options::EngineOptions;
use super::store_watch::StoreWatch;
use crate::backoff::Backoff;
use crate::identity::{Epoch, Identity};
use crate::metrics::Metrics;
use crate::store::{Finish, FinishWrite, Renewed, Store, Written};
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The keys whose answer this process still has to store, and the writer
/// that stores them. Clones share the keys.
#[derive(Clone)]
pub(super) struct Parked {
    keys: Arc<Mutex<HashSet<Identity>>>,
    store: Store,
    watch: StoreWatch,
    metrics: Metrics,
    backoff: Backoff,
    lease: Duration,
    shutdown: CancellationToken,
}

impl Parked {
    pub(super) fn new(
        store: &Store,
        watch: &StoreWatch,
        metrics: &Metrics,
        options: &EngineOptions,
        shutdown: &CancellationToken,
    ) -> Self {
        Self {
            keys: Arc::default(),
            store: store.clone(),
            watch: watch.clone(),
            metrics: metrics.clone(),
            backoff: options.backoff,
            lease: options.lease,
            shutdown: shutdown.clone(),
        }
    }

    /// Writes `finish` for the claim `(identity, epoch)` in the background
    /// until it lands, is fenced (another worker took the key: counted), or
    /// the process stops (then the key is taken over after its lease, as
    /// after a crash, and retried with the same request).
    pub(super) fn park(&self, identity: Identity, epoch: Epoch, finish: Finish) {
        let writer = self.clone();
        self.keys().insert(identity.clone());
        tokio::spawn(async move {
            writer.keep(&identity, epoch, finish).await;
            writer.keys().remove(&identity);
        });
    }

    /// Whether this process holds an answer for `identity` still to store.
    pub(super) fn holds(&self, identity: &Identity) -> bool {
        let keys = self.keys();
        !keys.is_empty() && keys.contains(identity)
    }

    fn keys(&self) -> MutexGuard<'_, HashSet<Identity>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn keep(&self, identity: &Identity, epoch: Epoch, finish: Finish) {
        let mut attempt = 1;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.backoff.after_attempt(attempt)) => {}
                _ = self.shutdown.cancelled() => {
                    tracing::warn!(%identity, epoch = epoch.0,
                        "stopping with an outcome not stored (its row was held); the key is retried after its lease");
                    return;
                }
            }
            attempt = attempt.saturating_add(1);
            if self.try_store(identity, epoch, &finish).await.is_break() {
                return;
            }
        }
    }

    /// One try: renew the lease, then write the outcome. Breaks once
    /// nothing more can be done (stored, fenced or refused).
    async fn try_store(
        &self,
        identity: &Identity,
        epoch: Epoch,
        finish: &Finish,
    ) -> ControlFlow<()> {
        match self
            .store
            .renew_leases(&[(identity, epoch)], self.lease)
            .await
        {
            Ok(r) if r.first() == Some(&Renewed::Lost) => return self.fenced(identity, epoch),
            Ok(_) => {}
            Err(e) => self.watch.failed(&e),
        }
        let write = [FinishWrite {
            identity,
            epoch,
            finish: finish.clone(),
            at: None,
        }];
        match self.store.finish_batch(&write).await {
            Ok(w) if w.first() == Some(&Written::Landed) => {
                tracing::info!(%identity, epoch = epoch.0, "held outcome stored");
                ControlFlow::Break(())
            }
            Ok(w) if w.first() == Some(&Written::Fenced) => self.fenced(identity, epoch),
            Ok(_) => ControlFlow::Continue(()),
            Err(e) if e.is_transient() => {
                self.watch.failed(&e);
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.watch.failed(&e);
                tracing::error!(%identity, error = %crate::telemetry::chain(&e),
                    "PostgreSQL refused the held outcome; the key stays open and uncertain");
                ControlFlow::Break(())
            }
        }
    }

    fn fenced(&self, identity: &Identity, epoch: Epoch) -> ControlFlow<()> {
        self.metrics.fenced_writes.inc();
        tracing::warn!(%identity, epoch = epoch.0, "held outcome fenced: another worker owns the key");
        ControlFlow::Break(())
    }
}
