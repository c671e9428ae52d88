//! RabbitMQ plumbing of the benchmark: the work queue (quorum, as dedupq
//! declares it by default), cleanup, and the raw consume-and-ack consumer.

use super::case::{Job, Measured};
use super::service::CASE_LIMIT;
use super::stats::{peak_rss_kb, usage};
use anyhow::Context;
use dedupq::config::AmqpSettings;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::time::Instant;

async fn channel(url: &str) -> anyhow::Result<(Connection, Channel)> {
    let c = dedupq::broker::amqp::connect(&AmqpSettings::at(url), "dedupq-bench")
        .await
        .context("connecting to RabbitMQ")?;
    let ch = c.create_channel().await?;
    Ok((c, ch))
}

/// Declares the queues of a case with dedupq's own topology code, so that
/// the work queue has every argument dedupq gives it.
pub(super) async fn declare(settings: &AmqpSettings) -> anyhow::Result<()> {
    dedupq::transport::amqp::prepare_topology(settings)
        .await
        .context("declaring the RabbitMQ topology")
}

/// Messages ready in `queue` (unacked ones are back once consumers left).
pub(super) async fn ready(url: &str, queue: &str) -> anyhow::Result<u32> {
    let (c, ch) = channel(url).await?;
    let options = QueueDeclareOptions {
        passive: true,
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let q = ch
        .queue_declare(queue.into(), options, FieldTable::default())
        .await?;
    let _ = c.close(200, "counted".into()).await;
    Ok(q.message_count())
}

/// Removes the work queue and whatever dedupq declared next to it.
pub(super) async fn delete(url: &str, queue: &str) {
    let Ok((c, ch)) = channel(url).await else {
        return;
    };
    for q in [
        queue.to_string(),
        format!("{queue}.delay"),
        format!("{queue}.dlq"),
    ] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = ch
        .exchange_delete(
            format!("{queue}.dlx").as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
    let _ = c.close(200, "cleaned up".into()).await;
}

/// (e) raw: consume with manual acks, ack every delivery on its own,
/// nothing else; `prefetch` is dedupq's (`amqp.prefetch`), so both get the
/// same window.
pub(super) async fn raw(job: &Job, prefetch: u16) -> anyhow::Result<Measured> {
    let (c, ch) = channel(&job.amqp_url).await?;
    ch.basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    let mut consumer = ch
        .basic_consume(
            job.source.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (mut seen, mut first) = (0, None);
    let deadline = Instant::now() + CASE_LIMIT;
    while seen < job.expected {
        let next = tokio::time::timeout_at(deadline, consumer.next())
            .await
            .context("raw RabbitMQ consumer timed out")?;
        let delivery = next.context("consumer ended")??;
        first.get_or_insert_with(Instant::now);
        delivery
            .acker
            .ack(BasicAckOptions { multiple: false })
            .await?;
        seen += 1;
    }
    let end = Instant::now();
    // The producer publishes at least once (it re-sends what was not
    // confirmed), so a few copies may follow: ack them too, so the queue
    // ends empty, and say how many there were.
    let mut extra = 0;
    while let Ok(Some(Ok(delivery))) =
        tokio::time::timeout(std::time::Duration::from_millis(500), consumer.next()).await
    {
        delivery
            .acker
            .ack(BasicAckOptions { multiple: false })
            .await?;
        extra += 1;
    }
    // Closing the channel first flushes the last acks.
    let _ = ch.close(200, "done".into()).await;
    let _ = c.close(200, "done".into()).await;
    Ok(Measured {
        messages: job.expected,
        seconds: (end - first.unwrap_or(end)).as_secs_f64(),
        latency: None,
        peak_rss_kb: peak_rss_kb(),
        notes: vec![
            usage(),
            format!("{extra} extra copies after the last expected message"),
        ],
    })
}
