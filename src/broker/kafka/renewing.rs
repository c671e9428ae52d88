//! An idempotent producer that replaces itself once librdkafka has put it
//! in a fatal state.
//!
//! librdkafka makes an idempotent producer fatal when the broker refuses
//! it a producer id (`CLUSTER_AUTHORIZATION_FAILED`: the principal lost
//! `IdempotentWrite` and every topic's `Write`), or when a broker's log
//! lost records the producer had been told were written. From then on
//! every record fails with `_FATAL`, whatever the broker says: only a new
//! client produces again. A dead letter retried on the old one would
//! hold its partition until dedupq restarts, even after the operator
//! fixed the cause; an async route would answer 503 for good.

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A [`FutureProducer`] built again from its configuration after a send
/// fails with `_FATAL`. The failed send still reports its error: the
/// caller retries as it does any failed delivery, on the new client.
pub struct Renewing {
    config: ClientConfig,
    current: Mutex<Arc<FutureProducer>>,
}

impl Renewing {
    pub fn new(config: ClientConfig) -> Result<Self, KafkaError> {
        let producer = config.create()?;
        Ok(Self {
            config,
            current: Mutex::new(Arc::new(producer)),
        })
    }

    fn current(&self) -> Arc<FutureProducer> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// [`FutureProducer::send`], on the client in use; a `_FATAL` error
    /// replaces that client before it is returned.
    pub async fn send<K, P>(
        &self,
        record: FutureRecord<'_, K, P>,
        queue_timeout: Duration,
    ) -> Result<(), KafkaError>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let producer = self.current();
        let sent = producer
            .send(record, Timeout::After(queue_timeout))
            .await
            .map(|_| ())
            .map_err(|(e, _)| e);
        if let Err(e) = &sent {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                self.renew(&producer);
            }
        }
        sent
    }

    /// Replaces `failed` if it is still the client in use (concurrent
    /// sends that failed on it renew it once).
    fn renew(&self, failed: &Arc<FutureProducer>) {
        let reason = failed
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
            .unwrap_or_else(|| "no reason given".into());
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&current, failed)
            || crate::broken::is(crate::broken::Break::FatalProducerKept)
        {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                let old = std::mem::replace(&mut *current, Arc::new(fresh));
                tracing::error!(
                    %reason,
                    "the Kafka producer is in a fatal state; replaced by a new client"
                );
                // Closing a client waits for its queue: not on an async worker.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn_blocking(move || drop(old));
                }
            }
            Err(e) => tracing::error!(
                %reason,
                error = %e,
                "the Kafka producer is in a fatal state and no new client could be made; trying again at the next send"
            ),
        }
    }
}

impl std::fmt::Debug for Renewing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewing").finish_non_exhaustive()
    }
}
