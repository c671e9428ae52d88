//! (b) The naive design the articles start from: per message, one claim
//! statement, the handler, one completion statement, each its own
//! transaction (a round trip and a WAL flush each), one message at a time
//! per partition. Same parser, handler, schema and consumer settings as
//! dedupq, so the difference is the batching.

use super::case::{Job, Measured};
use super::kafka::{self, Positions, COMMIT_INTERVAL};
use super::service::{self, FastHandler, CASE_LIMIT};
use super::stats::{peak_rss_kb, usage};
use anyhow::Context;
use chrono::Utc;
use dedupq::config::{IdentitySettings, SecretUrl, StoreSettings};
use dedupq::engine::{Incoming, Parser, Source};
use dedupq::handler::{Handler, HandlerCall, Request};
use dedupq::identity::Epoch;
use dedupq::store::Store;
use rdkafka::consumer::CommitMode;
use rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Insert the key or learn that it exists: one statement, one round trip.
pub(super) const CLAIM_SQL: &str = r#"
INSERT INTO dedupq_keys
    (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until, owner, attempts)
VALUES ($1, $2, $3, $4, 'in_progress', 1, now() + make_interval(secs => $5), $6, 1)
ON CONFLICT (tenant, key) DO NOTHING
RETURNING epoch
"#;

/// Store the result, fenced by the epoch the claim returned.
pub(super) const COMPLETE_SQL: &str = r#"
UPDATE dedupq_keys SET
    status = 'done', result_status = $4, result_body = convert_to($5, 'UTF8'),
    lease_until = NULL, completed_at = now(), updated_at = now()
WHERE tenant = $1 AND key = $2 AND epoch = $3 AND status = 'in_progress'
"#;

pub(super) const LEASE: Duration = Duration::from_secs(30);
const OWNER: &str = "bench-naive";

struct Worker {
    pool: PgPool,
    parser: Parser,
    handler: FastHandler,
}

/// A message with a stored outcome: its partition and offset.
type Done = (i32, i64);

pub(super) async fn run(job: &Job) -> anyhow::Result<Measured> {
    let settings = StoreSettings {
        url: SecretUrl::new(job.database_url.clone()),
        schema: Some(job.schema.clone()),
        max_connections: job.case.partitions as u32,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings)?;
    store.migrate(Some(&job.schema)).await?;
    let worker = Arc::new(Worker {
        pool: store.pool().clone(),
        parser: Parser::new(&IdentitySettings::default()),
        handler: FastHandler::default(),
    });
    let group = service::group(job);
    let consumer = kafka::consumer(&job.brokers, &group, &job.source)?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut lanes: HashMap<i32, mpsc::Sender<OwnedMessage>> = HashMap::new();
    let mut positions = Positions::default();
    let mut tick = tokio::time::interval(COMMIT_INTERVAL);
    let (mut seen, mut first) = (0, None);
    let deadline = Instant::now() + CASE_LIMIT;
    while seen < job.expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "naive consumer timed out at {seen}"
        );
        tokio::select! {
            m = consumer.recv() => {
                let m = m?.detach();
                first.get_or_insert_with(Instant::now);
                let lane = lanes
                    .entry(m.partition())
                    .or_insert_with(|| spawn_lane(worker.clone(), done_tx.clone()));
                lane.send(m).await.context("partition worker stopped")?;
            }
            Some((partition, offset)) = done_rx.recv() => {
                positions.done(partition, offset);
                seen += 1;
            }
            _ = tick.tick() => positions.commit(&consumer, &job.source, CommitMode::Async),
        }
    }
    positions.commit(&consumer, &job.source, CommitMode::Async);
    let ends = kafka::end_offsets(&job.brokers, &job.source, job.case.partitions).await?;
    let end = kafka::committed_to_end(&job.brokers, &group, &job.source, &ends, CASE_LIMIT).await?;
    Ok(Measured {
        messages: job.expected,
        seconds: (end - first.unwrap_or(end)).as_secs_f64(),
        latency: None,
        peak_rss_kb: peak_rss_kb(),
        notes: vec![usage()],
    })
}

/// One partition's messages, strictly one after the other.
fn spawn_lane(
    worker: Arc<Worker>,
    done: mpsc::UnboundedSender<Done>,
) -> mpsc::Sender<OwnedMessage> {
    let (tx, mut rx) = mpsc::channel::<OwnedMessage>(2000);
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            match worker.process(&m).await {
                Ok(()) => {
                    let _ = done.send((m.partition(), m.offset()));
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "naive worker failed");
                    return;
                }
            }
        }
    });
    tx
}

impl Worker {
    async fn process(&self, m: &OwnedMessage) -> anyhow::Result<()> {
        let mut incoming = Incoming::new(
            Source::Kafka {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
            },
            m.payload().unwrap_or_default(),
        );
        if let Some(hs) = m.headers() {
            for h in hs.iter() {
                incoming = incoming.with_header(h.key, h.value.unwrap_or_default());
            }
        }
        let parsed = self
            .parser
            .parse(&incoming)
            .map_err(|e| anyhow::anyhow!("invalid bench message: {e}"))?;
        let id = &parsed.identity;
        let epoch: Option<i64> = sqlx::query_scalar(CLAIM_SQL)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .bind(&parsed.fingerprint.digest[..])
            .bind(parsed.fingerprint.version)
            .bind(LEASE.as_secs_f64())
            .bind(OWNER)
            .fetch_optional(&self.pool)
            .await?;
        // No row: the key exists (a duplicate); nothing to do here.
        if let Some(epoch) = epoch {
            let call = HandlerCall {
                identity: id,
                derived_key: &parsed.derived_key,
                request: Request {
                    body: &incoming.body,
                    content_type: None,
                },
                headers: &incoming.headers,
                attempt: 1,
                epoch: Epoch(epoch),
                owner: OWNER,
                lease_deadline: Utc::now() + LEASE,
                source: &incoming.source,
                uncertain: false,
            };
            let _ = self.handler.handle(&call).await;
            let done = sqlx::query(COMPLETE_SQL)
                .bind(id.tenant.as_str())
                .bind(id.key.as_str())
                .bind(epoch)
                .bind(200_i32)
                .bind(r#"{"charged":true}"#)
                .execute(&self.pool)
                .await?;
            anyhow::ensure!(done.rows_affected() == 1, "completion of {id} was fenced");
        }
        Ok(())
    }
}
