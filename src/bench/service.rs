//! The system under test: the whole service, built in-process exactly as
//! `dedupq run` builds it (`Application::build_with_handler`), with a fast
//! in-process handler, consuming Kafka or RabbitMQ.

use super::case::{Job, Measured, Phase};
use super::kafka::{self, COMMIT_INTERVAL};
use super::stats::{peak_rss_kb, percentiles, usage};
use crate::config::{SecretUrl, Settings};
use crate::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use crate::metrics::Metrics;
use crate::startup::Application;
use anyhow::Context;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// Bounds every wait of a child, so a stuck case fails instead of hanging.
pub const CASE_LIMIT: Duration = Duration::from_secs(300);

/// Answers at once, like a handler whose provider call is negligible; the
/// benchmark measures what dedupq adds around the work. In latency runs it
/// keeps each key's send stamp from the body.
#[derive(Default)]
pub struct FastHandler {
    pub calls: AtomicUsize,
    pub first: OnceLock<Instant>,
    record: bool,
    pub stamps: Mutex<Vec<(String, i64)>>,
}

impl FastHandler {
    pub fn new(record: bool) -> Self {
        Self {
            record,
            ..Self::default()
        }
    }

    pub fn outcome() -> HandlerOutcome {
        HandlerOutcome::Success(HandlerResult::json(
            200,
            &serde_json::json!({ "charged": true }),
        ))
    }
}

#[async_trait]
impl Handler for FastHandler {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        self.first.get_or_init(Instant::now);
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.record {
            if let Some(sent) = sent_at(call.request.body) {
                let key = call.identity.key.as_str().to_string();
                self.stamps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((key, sent));
            }
        }
        Self::outcome()
    }
}

/// The producer's stamp, if this message carries one (warm-up and
/// throughput messages carry 0).
pub fn sent_at(body: &[u8]) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Stamp {
        sent_at_us: Option<i64>,
    }
    serde_json::from_slice::<Stamp>(body)
        .ok()?
        .sent_at_us
        .filter(|t| *t > 0)
}

/// The settings the bench runs with (`base`: defaults, or the file and
/// `DEDUPQ__…` variables given), with the endpoints, a fresh group and
/// names, and a commit interval short enough that the clock stops when the
/// work is done.
pub fn settings(job: &Job, amqp: bool, base: &Settings) -> Settings {
    let mut s = base.clone();
    s.store.url = SecretUrl::new(job.database_url.clone());
    s.store.schema = Some(job.schema.clone());
    s.http.listen = ([127, 0, 0, 1], 0).into();
    // The prefilled 10M rows must not be purged in the middle of a run.
    s.retention.keep = Duration::from_secs(3650 * 24 * 3600);
    if amqp {
        s.amqp.queues = vec![job.source.clone()];
        s.amqp.url = SecretUrl::new(job.amqp_url.clone());
        s.amqp.dead_letter_exchange = format!("{}.dlx", job.source);
        s.amqp.dead_letter_queue = format!("{}.dlq", job.source);
    } else {
        s.kafka.topics = vec![job.source.clone()];
        s.kafka.brokers = job.brokers.clone();
        s.kafka.group_id = group(job);
        s.kafka.create_topics = true;
        s.kafka.commit_interval = COMMIT_INTERVAL;
        if let Some(n) = job.case.buffered_per_partition {
            s.kafka.max_buffered_per_partition = n;
        }
    }
    s
}

pub fn group(job: &Job) -> String {
    format!("{}-group", job.source)
}

/// Runs the service until it has decided `job.expected` messages.
pub async fn run(job: &Job, amqp: bool, base: &Settings) -> anyhow::Result<Measured> {
    let settings = settings(job, amqp, base);
    settings.validate()?;
    let handler = std::sync::Arc::new(FastHandler::new(job.phase == Phase::Latency));
    let app = Application::build_with_handler(settings, handler.clone()).await?;
    let metrics = app.metrics().clone();
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    let deadline = Instant::now() + CASE_LIMIT;
    if job.phase == Phase::Latency {
        wait_for(deadline, "warm-up", || {
            handler.calls.load(Ordering::Relaxed) >= job.warmup
        })
        .await?;
        println!("READY");
    }
    wait_for(deadline, "every message decided", || {
        decided(&metrics) >= job.expected as u64
    })
    .await?;
    let mut end = Instant::now();
    if amqp {
        // Decided comes just before the ack is sent; let the last acks
        // leave before the shutdown closes the channel.
        tokio::time::sleep(Duration::from_millis(300)).await;
    } else {
        // The clock stops when the group's commit covers every message.
        let ends = kafka::end_offsets(&job.brokers, &job.source, job.case.partitions).await?;
        end = kafka::committed_to_end(&job.brokers, &group(job), &job.source, &ends, CASE_LIMIT)
            .await?;
    }
    stop.cancel();
    task.await.context("service task")??;
    let start = *handler.first.get().context("the handler never ran")?;
    let mut m = Measured {
        messages: job.expected,
        seconds: (end - start).as_secs_f64(),
        peak_rss_kb: peak_rss_kb(),
        notes: vec![
            breakdown(&metrics, handler.calls.load(Ordering::Relaxed)),
            usage(),
        ],
        ..Measured::default()
    };
    if job.phase == Phase::Latency {
        let stamps = std::mem::take(&mut *handler.stamps.lock().unwrap_or_else(|e| e.into_inner()));
        m.latency = percentiles(latencies(&job.log_path, &stamps)?);
    }
    Ok(m)
}

async fn wait_for(deadline: Instant, what: &str, done: impl Fn() -> bool) -> anyhow::Result<()> {
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Messages with a decision (every outcome, every transport).
fn decided(metrics: &Metrics) -> u64 {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == "dedupq_messages_total")
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().value() as u64)
        .sum()
}

/// Where the time went, from the service's own metrics.
fn breakdown(metrics: &Metrics, handler_calls: usize) -> String {
    let mean_ms = |statement: &str| {
        let h = metrics.store_duration.with_label_values(&[statement]);
        (
            h.get_sample_count(),
            1000.0 * h.get_sample_sum() / h.get_sample_count().max(1) as f64,
        )
    };
    let (claims, claim_ms) = mean_ms("claim");
    let size = &metrics.claim_batch_size;
    format!(
        "handler calls {handler_calls}; {claims} claim statements (mean {:.0} keys, {claim_ms:.2} ms)",
        size.get_sample_sum() / size.get_sample_count().max(1) as f64
    )
}

/// Milliseconds from each stamped message's send to the service's
/// "message decided" event for its key (written once the outcome is
/// stored, i.e. when its offset may be committed or its delivery acked).
fn latencies(log: &std::path::Path, stamps: &[(String, i64)]) -> anyhow::Result<Vec<f64>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut decided: HashMap<String, i64> = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v.get("message").and_then(|m| m.as_str()) != Some("message decided") {
            continue;
        }
        let (Some(key), Some(at)) = (
            v.get("key").and_then(|k| k.as_str()),
            v.get("timestamp")
                .and_then(|t| t.as_str())
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()),
        ) else {
            continue;
        };
        decided
            .entry(key.to_string())
            .or_insert(at.timestamp_micros());
    }
    let samples: Vec<f64> = stamps
        .iter()
        .filter_map(|(key, sent)| decided.get(key).map(|at| (at - sent) as f64 / 1000.0))
        .collect();
    anyhow::ensure!(
        samples.len() == stamps.len(),
        "{} of {} stamped messages have no decision in the log",
        stamps.len() - samples.len(),
        stamps.len()
    );
    Ok(samples)
}
