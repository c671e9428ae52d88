//! One measurement in a process of its own (`dedupq-lab bench --case JSON`):
//! prints `READY` once warmed up (latency runs) and `RESULT <json>` at the
//! end, so that its VmHWM is this case's peak RSS.

use super::case::{Job, Kind, Measured};
use super::kafka::{self, Positions, COMMIT_INTERVAL};
use super::service::{self, CASE_LIMIT};
use super::stats::{peak_rss_kb, usage};
use super::{amqp, echo, http, minimal, naive, pg_limit};
use dedupq::config::Settings;
use rdkafka::consumer::CommitMode;
use rdkafka::message::Message;
use tokio::time::Instant;

/// `settings` are this process's (file and `DEDUPQ__…` environment), so
/// a bench measures the configuration it is run with.
pub async fn run_job(job: &Job, settings: &Settings) -> anyhow::Result<Measured> {
    match job.case.kind {
        Kind::Dedupq => service::run(job, false, settings).await,
        Kind::DedupqAmqp => service::run(job, true, settings).await,
        Kind::Naive => naive::run(job).await,
        Kind::RawKafka => raw_kafka(job).await,
        Kind::RawAmqp => amqp::raw(job, settings.amqp.prefetch).await,
        Kind::PgLimit => pg_limit::run(job).await,
        Kind::MinimalClaim => minimal::run(job).await,
        Kind::Echo => echo::run(job).await,
        Kind::HttpSync => http::run(job, settings, http::Front::Dedupq).await,
        Kind::HttpDirect => http::run(job, settings, http::Front::Plain).await,
        Kind::HttpSeed => http::run(job, settings, http::Front::Seed).await,
    }
}

/// (c): receive, remember the position, commit on the same timer as
/// dedupq; nothing else.
async fn raw_kafka(job: &Job) -> anyhow::Result<Measured> {
    let group = service::group(job);
    let consumer = kafka::consumer(&job.brokers, &group, &job.source)?;
    let mut positions = Positions::default();
    let mut tick = tokio::time::interval(COMMIT_INTERVAL);
    let (mut seen, mut first) = (0, None);
    let deadline = Instant::now() + CASE_LIMIT;
    while seen < job.expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "raw consumer timed out at {seen}"
        );
        tokio::select! {
            m = consumer.recv() => {
                let m = m?;
                first.get_or_insert_with(Instant::now);
                positions.done(m.partition(), m.offset());
                seen += 1;
            }
            _ = tick.tick() => positions.commit(&consumer, &job.source, CommitMode::Async),
        }
    }
    positions.commit(&consumer, &job.source, CommitMode::Async);
    let ends = kafka::end_offsets(&job.brokers, &job.source, job.case.partitions).await?;
    let end = kafka::committed_to_end(&job.brokers, &group, &job.source, &ends, CASE_LIMIT).await?;
    let start = first.unwrap_or(end);
    Ok(Measured {
        messages: job.expected,
        seconds: (end - start).as_secs_f64(),
        latency: None,
        peak_rss_kb: peak_rss_kb(),
        notes: vec![usage()],
    })
}
