//! Produces dead letters and replies and waits for the broker's
//! confirmation: a source offset may only advance once its record is
//! confirmed.

use super::error::ProduceError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A record to produce.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

pub struct Outbox {
    pub producer: FutureProducer,
    /// Longest wait for room in librdkafka's local queue.
    pub queue_timeout: Duration,
    pub shutdown: CancellationToken,
}

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Outbox {
    /// Produces `record` until the broker confirms it; gives up only on
    /// shutdown (the source message then stays uncommitted).
    pub async fn send(&self, record: &Record) -> Result<(), ProduceError> {
        let mut backoff = BACKOFF_MIN;
        loop {
            let sent = tokio::select! {
                r = self.producer.send(to_future_record(record), self.queue_timeout) => r,
                _ = self.shutdown.cancelled() => return Err(shutdown(record)),
            };
            match sent {
                Ok(_) => return Ok(()),
                Err((source, _)) => {
                    let e = ProduceError::Delivery {
                        topic: record.topic.clone(),
                        source,
                    };
                    tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), retry_in = ?backoff, "produce failed");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return Err(shutdown(record)),
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

fn shutdown(record: &Record) -> ProduceError {
    ProduceError::Shutdown {
        topic: record.topic.clone(),
    }
}

fn to_future_record(r: &Record) -> FutureRecord<'_, [u8], [u8]> {
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
    for (key, value) in &r.headers {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_slice()),
        });
    }
    let mut fr = FutureRecord::to(&r.topic)
        .payload(r.payload.as_slice())
        .headers(headers);
    if let Some(key) = &r.key {
        fr = fr.key(key.as_slice());
    }
    fr
}
