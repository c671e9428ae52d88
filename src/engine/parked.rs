//! Outcomes whose row another transaction holds. The provider's answer is
//! never dropped: it is kept here, with the claim's lease renewed, and
//! written as soon as the row is free. The message meanwhile goes back to
//! its transport uncommitted and, when it comes again, finds the key held
//! (by this lease) or stored.

use super::core::Engine;
use crate::identity::{Epoch, Identity};
use crate::store::{Finish, FinishWrite, Renewed, Written};

impl Engine {
    /// Writes `finish` for the claim `(identity, epoch)` in the background
    /// until it lands, is fenced (another worker took the key: counted), or
    /// the process stops (then the key is taken over after its lease, as
    /// after a crash, and retried with the same request).
    pub(super) fn park(&self, identity: Identity, epoch: Epoch, finish: Finish) {
        let engine = self.clone();
        self.parked().insert(identity.clone());
        tokio::spawn(async move {
            engine.keep_parked(&identity, epoch, finish).await;
            engine.parked().remove(&identity);
        });
    }

    /// Whether this process holds an answer for `identity` still to store.
    pub(super) fn is_parked(&self, identity: &Identity) -> bool {
        let parked = self.parked();
        !parked.is_empty() && parked.contains(identity)
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<Identity>> {
        self.inner.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn keep_parked(&self, identity: &Identity, epoch: Epoch, finish: Finish) {
        let inner = &self.inner;
        let opts = &inner.options;
        let mut attempt = 1;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(opts.backoff.after_attempt(attempt)) => {}
                _ = inner.shutdown.cancelled() => {
                    tracing::warn!(%identity, epoch = epoch.0,
                        "stopping with an outcome not stored (its row was held); the key is retried after its lease");
                    return;
                }
            }
            attempt = attempt.saturating_add(1);
            match inner
                .store
                .renew_leases(&[(identity, epoch)], opts.lease)
                .await
            {
                Ok(r) if r.first() == Some(&Renewed::Lost) => return self.fenced(identity, epoch),
                Ok(_) => {}
                Err(e) => self.store_failed(&e),
            }
            let write = [FinishWrite {
                identity,
                epoch,
                finish: finish.clone(),
            }];
            match inner.store.finish_batch(&write).await {
                Ok(w) if w.first() == Some(&Written::Landed) => {
                    tracing::info!(%identity, epoch = epoch.0, "held outcome stored");
                    return;
                }
                Ok(w) if w.first() == Some(&Written::Fenced) => {
                    return self.fenced(identity, epoch)
                }
                Ok(_) => {}
                Err(e) if e.is_transient() => self.store_failed(&e),
                Err(e) => {
                    self.store_failed(&e);
                    tracing::error!(%identity, error = %crate::telemetry::chain(&e),
                        "PostgreSQL refused the held outcome; the key stays open and uncertain");
                    return;
                }
            }
        }
    }

    fn fenced(&self, identity: &Identity, epoch: Epoch) {
        self.inner.metrics.fenced_writes.inc();
        tracing::warn!(%identity, epoch = epoch.0, "held outcome fenced: another worker owns the key");
    }
}
