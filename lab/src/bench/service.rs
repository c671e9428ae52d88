//! The system under test: the whole service, built in-process exactly as
//! `dedupq run` builds it (`Application::build_with_handler`), with a fast
//! in-process handler, consuming Kafka or RabbitMQ.

use super::case::{Job, Measured, Phase};
use super::kafka::{self, COMMIT_INTERVAL};
use super::stats::{peak_rss_kb, usage};
use anyhow::Context;
use async_trait::async_trait;
use dedupq::config::{SecretUrl, Settings};
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use dedupq::metrics::Metrics;
use dedupq::startup::Application;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;

/// Bounds every wait of a child, so a stuck case fails instead of hanging.
pub(super) const CASE_LIMIT: Duration = Duration::from_secs(300);

/// Answers at once, like a handler whose provider call is negligible; the
/// benchmark measures what dedupq adds around the work.
#[derive(Default)]
pub(super) struct FastHandler {
    pub calls: AtomicUsize,
    pub first: OnceLock<Instant>,
}

impl FastHandler {
    pub(super) fn outcome() -> HandlerOutcome {
        HandlerOutcome::Success(HandlerResult::json(
            200,
            &serde_json::json!({ "charged": true }),
        ))
    }
}

#[async_trait]
impl Handler for FastHandler {
    async fn handle(&self, _: &HandlerCall<'_>) -> HandlerOutcome {
        self.first.get_or_init(Instant::now);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Self::outcome()
    }
}

/// The settings the bench runs with (`base`: defaults, or the file and
/// `DEDUPQ__…` variables given), with the endpoints, a fresh group and
/// names, and a commit interval short enough that the clock stops when the
/// work is done.
pub(super) fn settings(job: &Job, amqp: bool, base: &Settings) -> Settings {
    let mut s = base.clone();
    s.store.url = SecretUrl::new(job.database_url.clone());
    s.store.schema = Some(job.schema.clone());
    s.http.listen = ([127, 0, 0, 1], 0).into();
    // The prefilled 10M rows must not be purged in the middle of a run.
    s.retention.keep = Duration::from_secs(3650 * 24 * 3600).into();
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
        s.kafka.reply_topic = job.reply_topic.clone();
    }
    s
}

pub(super) fn group(job: &Job) -> String {
    format!("{}-group", job.source)
}

/// Runs the service until it has decided `job.expected` messages.
pub(super) async fn run(job: &Job, amqp: bool, base: &Settings) -> anyhow::Result<Measured> {
    let settings = settings(job, amqp, base);
    settings.validate()?;
    let handler = std::sync::Arc::new(FastHandler::default());
    let app = Application::build_with_handler(settings, handler.clone()).await?;
    let metrics = app.metrics().clone();
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    let deadline = Instant::now() + CASE_LIMIT;
    if job.phase == Phase::Latency {
        wait_for(deadline, "warm-up", || {
            decided(&metrics) >= job.warmup as u64
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
    Ok(Measured {
        messages: job.expected,
        seconds: (end - start).as_secs_f64(),
        peak_rss_kb: peak_rss_kb(),
        notes: vec![
            breakdown(&metrics, handler.calls.load(Ordering::Relaxed)),
            usage(),
        ],
        ..Measured::default()
    })
}

async fn wait_for(deadline: Instant, what: &str, done: impl Fn() -> bool) -> anyhow::Result<()> {
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Messages with a decision (every outcome, every transport). Reads that
/// one counter only: gathering the whole registry reads /proc, which would
/// cost the measured process a core's worth when polled this often.
fn decided(metrics: &Metrics) -> u64 {
    use prometheus::core::Collector;
    metrics
        .messages
        .collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().value() as u64)
        .sum()
}

/// Where the time went, from the service's own metrics: statements, their
/// mean and the histogram bucket their 99th percentile falls in.
pub(super) fn breakdown(metrics: &Metrics, handler_calls: usize) -> String {
    let stats = |statement: &str| {
        let h = metrics.store_duration.with_label_values(&[statement]);
        let n = h.get_sample_count();
        let mean = 1000.0 * h.get_sample_sum() / n.max(1) as f64;
        let families = prometheus::core::Collector::collect(&h);
        let p99 = families
            .iter()
            .flat_map(|f| f.get_metric())
            .flat_map(|m| m.get_histogram().get_bucket())
            .find(|b| b.cumulative_count() as f64 >= 0.99 * n as f64)
            .map_or(f64::INFINITY, |b| 1000.0 * b.upper_bound());
        format!("{n} {statement} calls ({mean:.2} ms, p99 <= {p99} ms)")
    };
    let size = &metrics.claim_batch_size;
    format!(
        "handler calls {handler_calls}; {} (mean {:.0} keys per statement); {}",
        stats("claim"),
        size.get_sample_sum() / size.get_sample_count().max(1) as f64,
        stats("finish"),
    )
}
