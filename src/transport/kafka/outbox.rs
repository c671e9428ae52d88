//! Produces dead letters and replies and waits for the broker's
//! confirmation: a source offset may only advance once its record is
//! confirmed.

use super::error::ProduceError;
use crate::backoff::Backoff;
use crate::broker::kafka::{headers, Renewing};
use crate::engine::Header;
use prometheus::IntCounter;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A record to produce. Header names are bytes: a dead letter keeps the
/// original headers, whatever their names.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Record {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<Header>,
}

/// How hard to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Persist {
    /// Until confirmed (a dead letter: the source offset waits for it), or
    /// shutdown.
    UntilConfirmed,
    /// At most this many tries (a reply: the outcome is stored either way,
    /// and a duplicate later replays it).
    Tries(u32),
}

pub(super) struct Outbox {
    /// Replaced when librdkafka makes it fatal: a dead letter waits for
    /// the new client, not for a restart.
    pub producer: Renewing,
    /// Longest wait for room in librdkafka's local queue.
    pub queue_timeout: Duration,
    /// Counts each try of a dead letter that failed
    /// (`dedupq_dead_letters_failed_total{transport="kafka"}`).
    pub dead_letters_failed: IntCounter,
    pub shutdown: CancellationToken,
}

const BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

impl Outbox {
    /// Produces `record` until the broker confirms it, as hard as
    /// `persist` says; gives up at once on shutdown.
    pub(super) async fn send(&self, record: &Record, persist: Persist) -> Result<(), ProduceError> {
        let mut attempt = 1;
        loop {
            let sent = tokio::select! {
                r = self.producer.send(to_future_record(record), self.queue_timeout) => r,
                _ = self.shutdown.cancelled() => return Err(shutdown(record)),
            };
            let source = match sent {
                Ok(()) => return Ok(()),
                Err(source) => source,
            };
            let error = ProduceError::Delivery {
                topic: record.topic.clone(),
                permanent: is_permanent(&source),
                source,
            };
            match persist {
                Persist::Tries(n) if attempt >= n => return Err(error),
                Persist::Tries(_) => {}
                Persist::UntilConfirmed => self.dead_letters_failed.inc(),
            }
            let wait = BACKOFF.after_attempt(attempt);
            tracing::warn!(error = %crate::telemetry::chain(&error), retry_in = ?wait, "produce failed");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.cancelled() => return Err(shutdown(record)),
            }
            attempt += 1;
        }
    }
}

/// Errors no retry cures without an operator (the dead-letter path makes
/// them impossible by checking topics at start-up and fitting records to
/// the size limit; a reply gives up on them).
fn is_permanent(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::TopicAuthorizationFailed
                | C::InvalidRecord
                | C::InvalidTopic
        )
    )
}

fn shutdown(record: &Record) -> ProduceError {
    ProduceError::Shutdown {
        topic: record.topic.clone(),
    }
}

fn to_future_record(r: &Record) -> FutureRecord<'_, [u8], [u8]> {
    let mut fr = FutureRecord::to(&r.topic)
        .payload(r.payload.as_slice())
        .headers(headers::owned(&r.headers));
    if let Some(key) = &r.key {
        fr = fr.key(key.as_slice());
    }
    fr
}
