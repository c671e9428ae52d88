//! Applying the engine's decisions to a batch: every publish a delivery
//! needs (reply, dead letter, delay queue) is confirmed before that
//! delivery is acked. Nothing else is ever acked.

use super::delivery::Meta;
use super::error::AmqpError;
use super::headers::{self as h, int, text};
use super::publish::{Need, Outgoing, Publisher};
use crate::config::AmqpSettings;
use crate::engine::{Action, Decision, Incoming};
use crate::metrics::Metrics;
use crate::store::StoredResult;
use chrono::Utc;
use lapin::options::BasicAckOptions;
use lapin::types::FieldTable;
use lapin::BasicProperties;

/// Longest `dedupq-detail` header kept; headers must fit in one frame.
const MAX_DETAIL: usize = 1024;
/// Dead-letter reason when a message used up `amqp.max_redeliveries`.
pub const RETRY_LIMIT: &str = "retry_limit";

pub(super) struct Applier<'a> {
    pub settings: &'a AmqpSettings,
    pub queue: &'a str,
    pub publisher: &'a Publisher,
    pub metrics: &'a Metrics,
}

impl Applier<'_> {
    /// Publishes what the decisions need, waits for the confirms, then acks
    /// the deliveries whose publishes landed. Returns the first failure (a
    /// delivery left unacked comes back after the runner reconnects).
    pub(super) async fn apply(
        &self,
        batch: Vec<Incoming>,
        metas: Vec<Meta>,
        decisions: Vec<Decision>,
    ) -> Result<(), AmqpError> {
        let mut plans: Vec<Option<usize>> = Vec::with_capacity(batch.len());
        let mut outgoing = Vec::new();
        for ((msg, meta), decision) in batch.into_iter().zip(&metas).zip(&decisions) {
            plans.push(self.plan(msg, meta, decision).map(|out| {
                outgoing.push(out);
                outgoing.len() - 1
            }));
        }
        let mut published = self.publisher.publish_all(&outgoing).await;
        let mut first_error = None;
        for (meta, plan) in metas.iter().zip(plans) {
            if let Some(i) = plan {
                let result = std::mem::replace(&mut published[i], Ok(()));
                if let Err(e) = result {
                    tracing::warn!(queue = self.queue, delivery_tag = meta.delivery_tag, error = %e, "publish failed; delivery stays unacked");
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            if let Err(e) = self.ack(meta).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn ack(&self, meta: &Meta) -> Result<(), AmqpError> {
        // `Ok(false)`: the acker belongs to a closed channel and nothing was
        // sent. The delivery is not done: it is redelivered and claimed again.
        let sent = meta
            .acker
            .ack(BasicAckOptions { multiple: false })
            .await
            .map_err(AmqpError::channel("basic.ack"))?;
        if !sent {
            return Err(AmqpError::StaleAck {
                queue: self.queue.to_string(),
                delivery_tag: meta.delivery_tag,
            });
        }
        let waited = (Utc::now() - meta.first_seen).to_std().unwrap_or_default();
        self.metrics
            .end_to_end
            .with_label_values(&["amqp"])
            .observe(waited.as_secs_f64());
        Ok(())
    }

    fn plan(&self, msg: Incoming, meta: &Meta, decision: &Decision) -> Option<Outgoing> {
        match &decision.action {
            Action::Commit { reply } => {
                let stored = reply.as_ref()?;
                let reply_to = meta.properties.reply_to().as_ref()?;
                Some(self.reply(reply_to.as_str(), meta, decision, stored))
            }
            Action::DeadLetter { reason, detail } => {
                Some(self.dead_letter(msg, meta, decision, reason.label(), detail))
            }
            Action::RetryLater { after } => {
                let trip = meta.trips.saturating_add(1);
                if trip > self.settings.max_redeliveries {
                    self.metrics
                        .dead_letters
                        .with_label_values(&[RETRY_LIMIT])
                        .inc();
                    let detail = format!(
                        "still '{}' after {} trips through the delay queue",
                        decision.outcome.label(),
                        meta.trips
                    );
                    tracing::warn!(queue = self.queue, identity = ?decision.identity.as_ref().map(|i| i.to_string()), %detail, "dead-lettering");
                    return Some(self.dead_letter(msg, meta, decision, RETRY_LIMIT, &detail));
                }
                Some(self.delay(msg, meta, trip, *after))
            }
        }
    }

    fn reply(
        &self,
        reply_to: &str,
        meta: &Meta,
        decision: &Decision,
        stored: &StoredResult,
    ) -> Outgoing {
        let mut table = FieldTable::default();
        table.insert(h::STATUS.into(), text(stored.status.as_str()));
        table.insert(h::RESULT_STATUS.into(), int(stored.result_status.into()));
        table.insert(h::OUTCOME.into(), text(decision.outcome.label()));
        let (tenant, key) = decision
            .identity
            .as_ref()
            .map(|i| (i.tenant.as_str(), i.key.as_str()))
            .unwrap_or_default();
        table.insert(h::TENANT.into(), text(tenant));
        table.insert(h::KEY.into(), text(key));
        // The same envelope as Kafka replies, so a requester reading both
        // transports parses one shape.
        let payload = serde_json::json!({
            "tenant": tenant,
            "key": key,
            "outcome": decision.outcome.label(),
            "status": stored.status,
            "result_status": stored.result_status,
            "body": stored.body,
        });
        let mut properties = BasicProperties::default()
            .with_headers(table)
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let request = &meta.properties;
        if let Some(id) = request
            .correlation_id()
            .clone()
            .or(request.message_id().clone())
        {
            properties = properties.with_correlation_id(id);
        }
        Outgoing {
            exchange: String::new(),
            routing_key: reply_to.to_string(),
            payload: payload.to_string().into_bytes(),
            properties,
            need: Need::Confirmed,
        }
    }

    fn dead_letter(
        &self,
        msg: Incoming,
        meta: &Meta,
        decision: &Decision,
        reason: &str,
        detail: &str,
    ) -> Outgoing {
        let mut extra = vec![
            (h::REASON, text(reason)),
            (h::DETAIL, text(truncate(detail, MAX_DETAIL))),
            (h::OUTCOME, text(decision.outcome.label())),
            (h::SOURCE_QUEUE, text(self.queue)),
            (
                h::DELIVERY_TAG,
                int(meta.delivery_tag.min(i64::MAX as u64) as i64),
            ),
            (h::FIRST_SEEN, h::rfc3339(meta.first_seen)),
            (h::TRIPS, int(meta.trips.into())),
        ];
        if let Some(id) = &decision.identity {
            extra.push((h::TENANT, text(id.tenant.as_str())));
            extra.push((h::KEY, text(id.key.as_str())));
        }
        if let Some(fp) = &decision.fingerprint {
            extra.push((h::FINGERPRINT, text(fp.hex())));
        }
        Outgoing {
            exchange: self.settings.dead_letter_exchange.clone(),
            routing_key: self.queue.to_string(),
            payload: msg.body,
            properties: h::republished(&meta.properties, extra),
            need: Need::Routed,
        }
    }

    fn delay(&self, msg: Incoming, meta: &Meta, trip: u32, after: std::time::Duration) -> Outgoing {
        let wait = self.settings.retry_delay(trip, after);
        let extra = vec![
            (h::TRIPS, int(trip.into())),
            (h::FIRST_SEEN, h::rfc3339(meta.first_seen)),
        ];
        Outgoing {
            exchange: String::new(),
            routing_key: self.settings.delay_queue(self.queue),
            payload: msg.body,
            properties: h::republished(&meta.properties, extra)
                .with_expiration(h::expiration(wait)),
            need: Need::Routed,
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
