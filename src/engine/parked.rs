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
        tokio::spawn(async move {
            let inner = &engine.inner;
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
                    .renew_leases(&[(&identity, epoch)], opts.lease)
                    .await
                {
                    Ok(r) if r.first() == Some(&Renewed::Lost) => {
                        inner.metrics.fenced_writes.inc();
                        tracing::warn!(%identity, epoch = epoch.0, "held outcome fenced: another worker owns the key");
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => engine.store_failed(&e),
                }
                let write = [FinishWrite {
                    identity: &identity,
                    epoch,
                    finish: finish.clone(),
                }];
                match inner.store.finish_batch(&write).await {
                    Ok(w) if w.first() == Some(&Written::Landed) => {
                        tracing::info!(%identity, epoch = epoch.0, "held outcome stored");
                        return;
                    }
                    Ok(w) if w.first() == Some(&Written::Fenced) => {
                        inner.metrics.fenced_writes.inc();
                        tracing::warn!(%identity, epoch = epoch.0, "held outcome fenced: another worker owns the key");
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if e.is_transient() => engine.store_failed(&e),
                    Err(e) => {
                        engine.store_failed(&e);
                        tracing::error!(%identity, error = %crate::telemetry::chain(&e),
                            "PostgreSQL refused the held outcome; the key stays open and uncertain");
                        return;
                    }
                }
            }
        });
    }
}
