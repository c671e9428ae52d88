//! Keeps the leases of running handlers alive, and stops a handler whose
//! lease cannot be kept before it ends (so a live but cut-off worker never
//! overlaps with the worker that takes over). Before a queued call starts,
//! its lease is checked on the monotonic clock (a process paused past its
//! lease finds it over), and when the wall clock says more time passed
//! than the monotonic one (a frozen VM), it is re-validated in PostgreSQL.

use crate::identity::{Epoch, Identity};
use crate::metrics::Metrics;
use crate::store::{Renewed, Store};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Slot {
    active: bool,
    /// The handler has answered; its outcome is being stored. The lease is
    /// still renewed, but a late renewal no longer cuts anything off.
    answered: bool,
    deadline: Instant,
    /// The wall-clock time of the claim or of the last renewal that held.
    renewed_wall: SystemTime,
    lost: CancellationToken,
}

pub(super) struct LeaseKeeper<'a> {
    claims: Vec<(&'a Identity, Epoch)>,
    slots: Mutex<Vec<Slot>>,
    lease: Duration,
    /// No call starts with less of its lease left than this.
    margin: Duration,
}

impl<'a> LeaseKeeper<'a> {
    /// `claimed_at` is when the claim statement was sent: the lease in the
    /// database ends no earlier than `claimed_at + lease`. Renewals come
    /// every `renew_every`.
    pub(super) fn new(
        claims: Vec<(&'a Identity, Epoch)>,
        claimed_at: Instant,
        lease: Duration,
        renew_every: Duration,
    ) -> Self {
        let wall = SystemTime::now() - claimed_at.elapsed();
        let slots = claims
            .iter()
            .map(|_| Slot {
                active: true,
                answered: false,
                deadline: claimed_at + lease,
                renewed_wall: wall,
                lost: CancellationToken::new(),
            })
            .collect();
        Self {
            claims,
            slots: Mutex::new(slots),
            lease,
            // A live worker's lease always has more than this left: it is
            // renewed every renew_every, at most lease/2.
            margin: renew_every.min(lease / 4),
        }
    }

    /// Whether claim `i`'s call may start: Err says why not. Its lease
    /// must have more than the margin left by this process's monotonic
    /// clock; if the wall clock says the lease may be over anyway (the
    /// process or its VM was frozen), PostgreSQL must confirm it first.
    pub(super) async fn check_before_call(&self, i: usize, store: &Store) -> Result<(), String> {
        let (deadline, renewed_wall) = {
            let slots = self.slots();
            let slot = &slots[i];
            if slot.lost.is_cancelled() {
                return Err("the lease was lost".into());
            }
            (slot.deadline, slot.renewed_wall)
        };
        let now = Instant::now();
        if now + self.margin >= deadline {
            return Err(format!(
                "by this process's clock its lease has {:?} left (margin {:?})",
                deadline.saturating_duration_since(now),
                self.margin
            ));
        }
        let by_wall = SystemTime::now()
            .duration_since(renewed_wall)
            .unwrap_or_default();
        if by_wall + self.margin < self.lease {
            return Ok(());
        }
        let started = (Instant::now(), SystemTime::now());
        match store.renew_leases(&[self.claims[i]], self.lease).await {
            Ok(r) if r.first() == Some(&Renewed::Held) => {
                let mut slots = self.slots();
                slots[i].deadline = started.0 + self.lease;
                slots[i].renewed_wall = started.1;
                Ok(())
            }
            Ok(_) => Err("PostgreSQL says the claim is no longer this worker's".into()),
            Err(e) => Err(format!(
                "the wall clock moved {by_wall:?} since the lease was renewed and PostgreSQL could not \
                 confirm it: {e}"
            )),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        // A poisoned lock only means another thread panicked mid-update of
        // plain flags; the data is still usable.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancelled when claim `i` can no longer be trusted to be ours.
    pub(super) fn lost_signal(&self, i: usize) -> CancellationToken {
        self.slots()[i].lost.clone()
    }

    /// Claim `i`'s handler answered: keep renewing while its outcome is
    /// stored (through a store outage, however long), but never count it
    /// lost or cut it off.
    pub(super) fn answered(&self, i: usize) {
        self.slots()[i].answered = true;
    }

    /// Stop renewing claim `i` (its outcome is stored).
    pub(super) fn forget(&self, i: usize) {
        self.slots()[i].active = false;
    }

    /// Renews every active claim each `every`, until dropped.
    pub(super) async fn run(
        &self,
        store: &Store,
        metrics: &Metrics,
        every: Duration,
        lease: Duration,
    ) {
        loop {
            tokio::time::sleep(every).await;
            let active: Vec<usize> = self
                .slots()
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active)
                .map(|(i, _)| i)
                .collect();
            if active.is_empty() {
                continue;
            }
            let batch: Vec<(&Identity, Epoch)> = active.iter().map(|&i| self.claims[i]).collect();
            let started = Instant::now();
            let started_wall = SystemTime::now();
            // Room for a lock wait (store.lock_timeout) on a row held elsewhere,
            // which only leaves that row behind, within the lease.
            let bound = lease.saturating_sub(every).max(every);
            let renewed = tokio::time::timeout(bound, store.renew_leases(&batch, lease)).await;
            let mut slots = self.slots();
            match renewed {
                Ok(Ok(renewed)) => {
                    let mut locked = Vec::new();
                    for (&i, renewed) in active.iter().zip(renewed) {
                        match renewed {
                            Renewed::Held => {
                                slots[i].deadline = started + lease;
                                slots[i].renewed_wall = started_wall;
                            }
                            // Held by another transaction: not extended.
                            Renewed::Locked => locked.push(i),
                            // Not a loss when the outcome was stored while
                            // the renewal was under way.
                            Renewed::Lost if slots[i].active && !slots[i].answered => {
                                metrics.lost_leases.inc();
                                slots[i].lost.cancel();
                            }
                            Renewed::Lost => {}
                        }
                    }
                    expire_unsafe(&mut slots, &locked, every, metrics);
                }
                Ok(Err(e)) => {
                    metrics.store_error(&e);
                    tracing::warn!(error = %e, "lease renewal failed");
                    expire_unsafe(&mut slots, &active, every, metrics);
                }
                Err(_) => {
                    tracing::warn!("lease renewal timed out");
                    expire_unsafe(&mut slots, &active, every, metrics);
                }
            }
        }
    }
}

/// Gives up claims whose lease would end before the next renewal chance.
fn expire_unsafe(slots: &mut [Slot], active: &[usize], every: Duration, metrics: &Metrics) {
    let next_chance = Instant::now() + every;
    for &i in active {
        let slot = &slots[i];
        if slot.active
            && !slot.answered
            && next_chance >= slot.deadline
            && !slot.lost.is_cancelled()
        {
            metrics.lost_leases.inc();
            slots[i].lost.cancel();
        }
    }
}
