//! (d) PostgreSQL's limit: the batched claim and finish statements alone
//! (`Store::claim_batch` + `Store::finish_batch`), no broker, no parsing,
//! driven as fast as possible over a few connections.

use super::case::{Job, Measured};
use super::produce::TENANT;
use super::stats::{peak_rss_kb, percentiles, usage};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::fingerprint::{Fingerprint, FingerprintSpec};
use dedupq::identity::{IdempotencyKey, Identity, Tenant};
use dedupq::store::{Answer, ClaimRequest, ClaimResult, Finish, FinishWrite, Store};
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The claim batch dedupq forms from a full poll (kafka.batch_size and
/// engine.max_batch default to 500).
pub(super) const BATCH: usize = 500;
const LEASE: Duration = Duration::from_secs(30);

pub(super) async fn run(job: &Job) -> anyhow::Result<Measured> {
    let connections = job.case.partitions.max(1) as usize;
    let settings = StoreSettings {
        url: SecretUrl::new(job.database_url.clone()),
        schema: Some(job.schema.clone()),
        max_connections: connections as u32,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings)?;
    store.migrate(Some(&job.schema)).await?;
    let items = identities(job.expected)?;
    measure_batches(
        job,
        connections,
        store,
        items,
        |store, items, next| async move { drive(&store, &items, &next).await },
    )
    .await
}

/// Runs `drive` on `connections` tasks that take batches of `items`
/// through one shared cursor, each task with its own clone of `conn`; the
/// run's rate is the row's msg/s and one batch's round trips its latency.
pub(super) async fn measure_batches<C, T, F, Fut>(
    job: &Job,
    connections: usize,
    conn: C,
    items: Vec<T>,
    drive: F,
) -> anyhow::Result<Measured>
where
    C: Clone + Send + 'static,
    T: Send + Sync + 'static,
    F: Fn(C, Arc<Vec<T>>, Arc<AtomicUsize>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<f64>>> + Send + 'static,
{
    let items = Arc::new(items);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(drive(conn.clone(), items.clone(), next.clone())))
        .collect();
    let mut batch_ms = Vec::new();
    for w in workers {
        batch_ms.extend(w.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let batches = batch_ms.len();
    Ok(Measured {
        messages: job.expected,
        seconds,
        // Not end to end: one batch's claim + finish round trips.
        latency: percentiles(batch_ms),
        peak_rss_kb: peak_rss_kb(),
        notes: vec![
            format!("{batches} batches of {BATCH} over {connections} connection(s); latency = claim+finish of one batch"),
            usage(),
        ],
    })
}

pub(super) fn identities(n: usize) -> anyhow::Result<Vec<(Identity, Fingerprint, Vec<u8>)>> {
    let spec = FingerprintSpec::default();
    let tenant = Tenant::parse(TENANT.as_bytes())?;
    let mut rng = rand::rng();
    (0..n)
        .map(|j| {
            let key = format!("{:016x}{:016x}", rng.random::<u64>(), rng.random::<u64>());
            let body = serde_json::json!({
                "amount": 100 + j % 9000, "currency": "EUR",
                "recipient": format!("acct-{}", j % 997), "purpose": format!("invoice {j}"),
            })
            .to_string()
            .into_bytes();
            let parsed = dedupq::json::parse(&body)?;
            Ok((
                Identity {
                    tenant: tenant.clone(),
                    key: IdempotencyKey::parse(key.as_bytes())?,
                },
                spec.fingerprint(&parsed, &body),
                body,
            ))
        })
        .collect()
}

/// Claims and finishes batches until every item is taken; returns each
/// batch's duration (ms).
async fn drive(
    store: &Store,
    items: &[(Identity, Fingerprint, Vec<u8>)],
    next: &AtomicUsize,
) -> anyhow::Result<Vec<f64>> {
    let mut durations = Vec::new();
    loop {
        let from = next.fetch_add(BATCH, Ordering::Relaxed);
        if from >= items.len() {
            return Ok(durations);
        }
        let chunk = &items[from..(from + BATCH).min(items.len())];
        let t = Instant::now();
        let derived: Vec<String> = chunk.iter().map(|(id, ..)| id.derived_key()).collect();
        let requests: Vec<ClaimRequest> = chunk
            .iter()
            .zip(&derived)
            .map(
                |((identity, fingerprint, body), derived_key)| ClaimRequest {
                    identity,
                    fingerprint,
                    body,
                    content_type: Some("application/json"),
                    derived_key,
                    route: None,
                },
            )
            .collect();
        let results = store.claim_batch(&requests, "bench-pg", LEASE).await?;
        let mut writes = Vec::with_capacity(chunk.len());
        for ((identity, ..), r) in chunk.iter().zip(results) {
            let ClaimResult::Won(claim) = r else {
                anyhow::bail!("fresh key {identity} not won: {r:?}");
            };
            writes.push(FinishWrite {
                identity,
                epoch: claim.epoch,
                finish: Finish::Done(Answer {
                    status: 200,
                    body: br#"{"charged":true}"#.to_vec(),
                    content_type: Some("application/json".into()),
                }),
                at: claim.at,
            });
        }
        let landed = store.finish_batch(&writes).await?;
        anyhow::ensure!(
            landed.iter().all(|l| *l == dedupq::store::Written::Landed),
            "a finish was fenced or locked"
        );
        durations.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}
