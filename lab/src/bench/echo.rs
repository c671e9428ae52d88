//! (g) raw echo: consume each record and produce it to the reply topic, with
//! the consumer settings of (c) and the producer settings dedupq's replies
//! use; a position is committed once its echo is confirmed. What the
//! brokers alone cost from `send()` to a reply.

use super::case::{Job, Measured};
use super::kafka::{self, Positions, COMMIT_INTERVAL};
use super::service::{self, CASE_LIMIT};
use super::stats::{peak_rss_kb, usage};
use anyhow::{anyhow, Context};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use rdkafka::consumer::CommitMode;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::time::Instant;

pub(super) async fn run(job: &Job) -> anyhow::Result<Measured> {
    let reply = job
        .reply_topic
        .as_deref()
        .context("an echo needs a reply topic")?;
    let group = service::group(job);
    let consumer = kafka::consumer(&job.brokers, &group, &job.source)?;
    let kafka = dedupq::config::KafkaSettings::at(&job.brokers);
    let producer: FutureProducer = dedupq::broker::kafka::client(&kafka, "dedupq-bench-echo")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .create()
        .context("creating the echo producer")?;
    let mut positions = Positions::default();
    let mut pending = FuturesUnordered::new();
    let mut tick = tokio::time::interval(COMMIT_INTERVAL);
    let (mut echoed, mut first) = (0, None);
    let deadline = Instant::now() + CASE_LIMIT;
    while echoed < job.expected {
        anyhow::ensure!(Instant::now() < deadline, "echo timed out at {echoed}");
        tokio::select! {
            m = consumer.recv() => {
                let m = m?;
                first.get_or_insert_with(Instant::now);
                let record = FutureRecord::to(reply)
                    .key(m.key().unwrap_or_default())
                    .payload(m.payload().unwrap_or_default());
                let delivery = producer
                    .send_result(record)
                    .map_err(|(e, _)| anyhow!("producing the echo: {e}"))?;
                let (partition, offset) = (m.partition(), m.offset());
                pending.push(delivery.map(move |r| (partition, offset, r)));
            }
            Some((partition, offset, delivered)) = pending.next(), if !pending.is_empty() => {
                match delivered {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => anyhow::bail!("echo not delivered: {e}"),
                    Err(_) => anyhow::bail!("echo delivery cancelled"),
                }
                positions.done(partition, offset);
                echoed += 1;
                if echoed == job.warmup {
                    println!("READY");
                }
            }
            _ = tick.tick() => positions.commit(&consumer, &job.source, CommitMode::Async),
        }
    }
    positions.commit(&consumer, &job.source, CommitMode::Async);
    let end = Instant::now();
    Ok(Measured {
        messages: job.expected,
        seconds: (end - first.unwrap_or(end)).as_secs_f64(),
        latency: None,
        peak_rss_kb: peak_rss_kb(),
        notes: vec![usage()],
    })
}
