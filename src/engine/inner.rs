//! What the clones of one leased [`Engine`](super::Engine) share: the key
//! table, the handler, the rules, and the state that outlives a batch.

use super::group::Group;
use super::message::Parser;
use super::options::EngineOptions;
use super::parked::Parked;
use super::provider_gate::ProviderGate;
use super::store_watch::StoreWatch;
use super::streaks::Streaks;
use crate::handler::Handler;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::Store;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub(super) struct Inner {
    pub store: Store,
    pub handler: Arc<dyn Handler>,
    pub parser: Parser,
    pub options: EngineOptions,
    /// Handler runs at once in this process (`engine.concurrency`).
    pub permits: Semaphore,
    pub metrics: Metrics,
    pub health: Health,
    /// Provider-wide outages: pauses intake, lets one probe through.
    pub gate: ProviderGate,
    /// Keys retried in a row without using an attempt.
    pub streaks: Streaks,
    /// Answers kept for rows another transaction holds.
    pub parked: Parked,
    /// How key-table statements fare; writes retried through an outage.
    pub watch: StoreWatch,
    /// Claims and finishes of concurrent callers, sharing statements.
    pub statements: Group,
}

impl Inner {
    pub(super) fn new(
        store: Store,
        handler: Arc<dyn Handler>,
        parser: Parser,
        options: EngineOptions,
        metrics: Metrics,
        health: Health,
        shutdown: CancellationToken,
    ) -> Self {
        let watch = StoreWatch::new(
            metrics.clone(),
            health.clone(),
            options.backoff,
            shutdown.clone(),
        );
        // Small groups: one statement at a time, a second beside a stalled one.
        let lanes = store.claim_lanes().min(2);
        Self {
            statements: Group::new(
                store.clone(),
                options.owner.clone(),
                options.lease,
                options.max_batch,
                lanes,
                Some(metrics.claim_batch_size.clone()),
            ),
            permits: Semaphore::new(options.concurrency),
            gate: ProviderGate::new(
                options.outage_after,
                options.backoff,
                metrics.clone(),
                health.clone(),
            ),
            streaks: Streaks::default(),
            parked: Parked::new(&store, &watch, &metrics, &options, &shutdown),
            watch,
            store,
            handler,
            parser,
            options,
            metrics,
            health,
        }
    }
}
