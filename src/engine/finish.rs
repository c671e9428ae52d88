//! Storing the outcomes of finished handlers: gathered as they finish (a
//! slow handler never holds back the ones before it), written in one
//! statement per group, fenced by epoch, while the leases of the handlers
//! still running are renewed; one row at a time where PostgreSQL refuses
//! the statement itself.

use super::batch::{Owned, Ran};
use super::group::FinishRow;
use super::inner::Inner;
use super::verdict::Verdict;
use crate::store::{Answer, Finish, FinishWrite, StoreError, Written};
use crate::telemetry::spans;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tracing::Instrument;

/// How long handlers that finished wait for the next one before their
/// outcomes are stored. Handlers that finish together (a fast provider, or
/// handlers let through the concurrency limit one wave after another, as
/// permits come back from other batches) are stored in one statement, and
/// a slow handler never holds back the ones that finished before it for
/// longer than this.
const GATHER: Duration = Duration::from_millis(1);

/// Whether a finish write landed.
pub(super) enum Stored {
    Landed,
    /// The epoch no longer matches: another worker owns the key.
    Fenced,
    /// Another transaction holds the row: the finish is written later, in
    /// the background, while the lease is kept (see `parked.rs`).
    Locked(Finish),
    /// PostgreSQL refused the row itself (not an outage).
    Rejected(String),
}

impl Stored {
    fn of(written: Written, finish: &Finish) -> Self {
        match written {
            Written::Landed => Stored::Landed,
            Written::Fenced => Stored::Fenced,
            Written::Locked => Stored::Locked(finish.clone()),
        }
    }

    /// The store event of a message's span.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Stored::Landed => "landed",
            Stored::Fenced => "fenced",
            Stored::Locked(_) => "locked",
            Stored::Rejected(_) => "rejected",
        }
    }
}

/// The next handler to finish, plus every other that finishes with it or
/// within `GATHER` of the one before, so they are stored together. The
/// lease keeper keeps renewing meanwhile.
pub(super) async fn next_finished<F: Future<Output = (usize, Ran)>>(
    running: &mut FuturesUnordered<F>,
    renewal: &mut Pin<&mut impl Future<Output = ()>>,
) -> Vec<(usize, Ran)> {
    let first = loop {
        tokio::select! {
            Some(done) = running.next() => break done,
            _ = renewal.as_mut() => {}
        }
    };
    let mut ready = vec![first];
    loop {
        while let Some(Some(done)) = running.next().now_or_never() {
            ready.push(done);
        }
        if running.is_empty() {
            break;
        }
        let next = tokio::select! {
            next = tokio::time::timeout(GATHER, running.next()) => next,
            _ = renewal.as_mut() => continue,
        };
        match next {
            Ok(Some(done)) => ready.push(done),
            _ => break,
        }
    }
    ready
}

/// Awaits `work` while the lease keeper keeps renewing the claims that
/// are still running.
pub(super) async fn keep_renewing<T>(
    renewal: &mut Pin<&mut impl Future<Output = ()>>,
    work: impl Future<Output = T>,
) -> T {
    tokio::pin!(work);
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = renewal.as_mut() => {}
        }
    }
}

/// Stores the verdicts in one statement, waiting out an outage. If
/// PostgreSQL refuses the statement itself, each row is written on its
/// own, so one bad row never holds back (or re-runs) its batch-mates.
pub(super) async fn store_verdicts(
    inner: &Inner,
    owned: &[Owned<'_>],
    verdicts: &[(usize, Verdict)],
) -> Result<Vec<Stored>, StoreError> {
    let writes: Vec<FinishWrite> = verdicts
        .iter()
        .map(|(j, v)| FinishWrite {
            identity: &owned[*j].pending.parsed.identity,
            epoch: owned[*j].claim.epoch,
            finish: v.finish.clone(),
            at: owned[*j].claim.at,
        })
        .collect();
    let timer = inner
        .metrics
        .store_duration
        .with_label_values(&["finish"])
        .start_timer();
    // Shared with the finishes of concurrent callers (see group.rs).
    let rows = || {
        writes
            .iter()
            .map(|w| FinishRow {
                identity: w.identity.clone(),
                epoch: w.epoch,
                finish: w.finish.clone(),
                at: w.at,
            })
            .collect()
    };
    let whole = inner
        .watch
        .retry(|| inner.statements.finish(rows()))
        .instrument(spans::finish(writes.len()))
        .await;
    timer.observe_duration();
    match whole {
        Ok(written) => Ok(written
            .into_iter()
            .zip(&writes)
            .map(|(w, write)| Stored::of(w, &write.finish))
            .collect()),
        Err(e) if e.is_transient() => Err(e),
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::chain(&e), rows = writes.len(),
                "PostgreSQL refused a finish statement; writing its rows one by one");
            let mut out = Vec::with_capacity(writes.len());
            for write in &writes {
                out.push(store_alone(inner, write).await?);
            }
            Ok(out)
        }
    }
}

/// One row on its own; if refused, once more without the answer's body
/// (the status is what matters about money), then give up on the row.
async fn store_alone(inner: &Inner, write: &FinishWrite<'_>) -> Result<Stored, StoreError> {
    let attempt = |finish: Finish| {
        let one = [FinishWrite {
            identity: write.identity,
            epoch: write.epoch,
            finish,
            at: write.at,
        }];
        async move { inner.watch.retry(|| inner.store.finish_batch(&one)).await }
    };
    let refused = match attempt(write.finish.clone()).await {
        Ok(written) => return Ok(Stored::of(written[0], &write.finish)),
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => crate::telemetry::chain(&e).to_string(),
    };
    let bare = |a: &Answer| Answer {
        status: a.status,
        body: Vec::new(),
        content_type: None,
    };
    let without_body = match &write.finish {
        Finish::Done(a) => Finish::Done(bare(a)),
        Finish::Failed(a) => Finish::Failed(bare(a)),
        _ => return Ok(Stored::Rejected(refused)),
    };
    tracing::warn!(identity = %write.identity, error = %refused,
        "PostgreSQL refused the answer's body; storing the outcome without it");
    match attempt(without_body.clone()).await {
        Ok(written) => Ok(Stored::of(written[0], &without_body)),
        Err(e) if e.is_transient() => Err(e),
        Err(e) => Ok(Stored::Rejected(crate::telemetry::chain(&e).to_string())),
    }
}
