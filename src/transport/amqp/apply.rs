//! Applying the engine's decisions to a batch: every publish a delivery
//! needs (dead letter, delay queue) is confirmed before that delivery is
//! acked. A reply is tried a few times; if `reply_to` refuses it, the
//! failure is counted and the delivery acked anyway (the outcome is stored
//! and a duplicate replays it), so a bad reply address never stalls the
//! queue.
//!
//! A dead letter RabbitMQ refuses (403: the user lost `write` on the
//! dead-letter exchange) closes the publishing channel, not the
//! connection. Ending the session would bring the message back first in
//! the queue, to be refused again, one session after another, with the
//! queue behind it waiting. Instead its delivery is parked: published to
//! the delay queue unchanged (its trip not counted), acked once that is
//! confirmed, and dead-lettered again when it comes back after
//! `amqp.retry_delay_max`; the queue goes on meanwhile. What else failed
//! on the closed channel is published again on a new one.

use super::delivery::Meta;
use super::error::AmqpError;
use super::headers::{self as h, table_of};
use crate::backoff::Backoff;
use crate::broker::amqp::{Outgoing, PublishError, Reopening};
use crate::config::AmqpSettings;
use crate::engine::{Action, Decision, Incoming};
use crate::message::Transport;
use crate::metrics::Metrics;
use crate::store::StoredResult;
use crate::transport::envelope::{self, Origin};
use chrono::Utc;
use lapin::options::BasicAckOptions;
use lapin::BasicProperties;
use std::time::Duration;

/// Tries for a reply before it is given up.
const REPLY_TRIES: u32 = 3;
const REPLY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));

pub(super) struct Applier<'a> {
    pub settings: &'a AmqpSettings,
    pub queue: &'a str,
    pub publisher: &'a Reopening,
    pub metrics: &'a Metrics,
}

/// What one delivery needs published before its ack.
enum Plan {
    Nothing,
    /// Must be confirmed, or the delivery stays unacked.
    Required(Outgoing),
    /// A dead letter, counted under its reason once confirmed. If RabbitMQ
    /// refuses it, `parked` (the message as it came, for the delay queue)
    /// is published instead.
    DeadLetter {
        out: Outgoing,
        reason: &'static str,
        parked: Box<Outgoing>,
    },
    /// Tried; a refusal is counted, not fatal.
    Reply(Outgoing),
}

impl Applier<'_> {
    /// Publishes what the decisions need, waits for the confirms, then acks
    /// the deliveries whose required publishes landed. Returns how many
    /// were acked and the first failure (a delivery left unacked comes back
    /// after the runner reconnects).
    pub(super) async fn apply(
        &self,
        batch: Vec<Incoming>,
        metas: Vec<Meta>,
        decisions: Vec<Decision>,
    ) -> (usize, Result<(), AmqpError>) {
        let plans: Vec<Plan> = batch
            .into_iter()
            .zip(&metas)
            .zip(&decisions)
            .map(|((msg, meta), d)| self.plan(msg, meta, d))
            .collect();
        let required: Vec<&Outgoing> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Required(out) | Plan::DeadLetter { out, .. } => Some(out),
                _ => None,
            })
            .collect();
        let publisher = self.publisher.current().await;
        let mut confirmed = publisher.publish_all(&required).await.into_iter();
        let mut first_error = None;
        let mut done = Vec::with_capacity(metas.len());
        for (meta, plan) in metas.iter().zip(&plans) {
            let published = match plan {
                Plan::Required(out) => match confirmed.next() {
                    Some(Err(e)) => self.again(out, e).await,
                    _ => Ok(()),
                },
                Plan::DeadLetter {
                    out,
                    reason,
                    parked,
                } => {
                    let sent = match confirmed.next() {
                        Some(Err(e)) => self.again(out, e).await,
                        _ => Ok(()),
                    };
                    if sent.is_err() {
                        self.metrics
                            .dead_letters_failed
                            .with_label_values(&[Transport::Amqp.label()])
                            .inc();
                    }
                    match sent {
                        Ok(()) => {
                            self.metrics.dead_letters.with_label_values(&[reason]).inc();
                            Ok(())
                        }
                        Err(e) if e.access_refused() => self.park(meta, reason, parked, e).await,
                        Err(e) => Err(e),
                    }
                }
                Plan::Reply(out) => {
                    self.reply(out).await;
                    Ok(())
                }
                Plan::Nothing => Ok(()),
            };
            if let Err(e) = published.map_err(AmqpError::from) {
                tracing::warn!(queue = self.queue, delivery_tag = meta.delivery_tag, error = %crate::telemetry::chain(&e), "publish failed; delivery stays unacked");
                first_error.get_or_insert(e);
                continue;
            }
            done.push(meta);
        }
        // Each ack waits for lapin's connection task to take its frame:
        // one after another, a batch of hundreds waited that round trip
        // as many times, with its prefetch window held meanwhile.
        let mut acked = 0;
        for result in futures::future::join_all(done.into_iter().map(|m| self.ack(m))).await {
            match result {
                Ok(()) => acked += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        (acked, first_error.map_or(Ok(()), Err))
    }

    /// `out` once more, alone, after `failed`: if the broker closed the
    /// publishing channel (this publish was refused, or another one sent
    /// on it), on a new channel. `failed` stands when the channel lives
    /// (a nack, a return) or the connection is gone.
    async fn again(&self, out: &Outgoing, failed: PublishError) -> Result<(), PublishError> {
        let publisher = self.publisher.live().await?;
        if !matches!(failed, PublishError::Channel { .. }) || !publisher.is_open() {
            return Err(failed);
        }
        publisher.publish(out).await
    }

    /// The dead letter was refused: the message goes to the delay queue
    /// unchanged, and is dead-lettered again when it comes back.
    async fn park(
        &self,
        meta: &Meta,
        reason: &str,
        parked: &Outgoing,
        refused: PublishError,
    ) -> Result<(), PublishError> {
        let publisher = self.publisher.live().await?;
        publisher.publish(parked).await?;
        tracing::error!(
            queue = self.queue,
            delivery_tag = meta.delivery_tag,
            reason,
            exchange = %self.settings.dead_letter_exchange,
            error = %crate::telemetry::chain(&refused),
            retry_in = ?self.settings.retry_delay_max,
            "RabbitMQ refused the dead letter (grant this user `write` on the dead-letter exchange); the message waits in the delay queue and is dead-lettered again when it comes back"
        );
        Ok(())
    }

    /// A reply, tried a few times; never fails the delivery.
    async fn reply(&self, out: &Outgoing) {
        for attempt in 1..=REPLY_TRIES {
            let sent = match self.publisher.live().await {
                Ok(publisher) => publisher.publish(out).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(()) => return,
                Err(e) if attempt == REPLY_TRIES => {
                    self.metrics
                        .replies_failed
                        .with_label_values(&[Transport::Amqp.label()])
                        .inc();
                    tracing::warn!(queue = self.queue, destination = %out.destination(), error = %crate::telemetry::chain(&e),
                        "reply not delivered; the outcome stays stored");
                }
                Err(_) => tokio::time::sleep(REPLY_BACKOFF.after_attempt(attempt)).await,
            }
        }
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
            .with_label_values(&[Transport::Amqp.label()])
            .observe(waited.as_secs_f64());
        Ok(())
    }

    fn plan(&self, msg: Incoming, meta: &Meta, decision: &Decision) -> Plan {
        match &decision.action {
            Action::Commit { reply: None } => Plan::Nothing,
            Action::Commit {
                reply: Some(stored),
            } => match meta.properties.reply_to() {
                Some(reply_to) => {
                    Plan::Reply(self.reply_to(reply_to.as_str(), meta, decision, stored))
                }
                None => Plan::Nothing,
            },
            Action::DeadLetter { reason, detail } => {
                let origin = Origin::Amqp {
                    queue: self.queue,
                    delivery_tag: meta.delivery_tag,
                    trips: meta.trips,
                };
                let own = envelope::dead_letter_headers(
                    decision,
                    reason,
                    detail,
                    &origin,
                    meta.first_seen,
                );
                // Not a trip: the message was not tried, only refused a
                // place in the dead-letter queue.
                let parked = Box::new(self.delayed(
                    msg.body.clone(),
                    meta,
                    meta.trips,
                    self.settings.retry_delay_max,
                ));
                let out = Outgoing {
                    exchange: self.settings.dead_letter_exchange.clone(),
                    routing_key: self.queue.to_string(),
                    payload: msg.body,
                    properties: h::republished(&meta.properties, &own),
                };
                Plan::DeadLetter {
                    out,
                    reason: reason.label(),
                    parked,
                }
            }
            Action::RetryLater { after } | Action::Postpone { after } => {
                // A postponed message was not tried: its trip is not counted.
                let counted = matches!(decision.action, Action::RetryLater { .. });
                let trip = meta.trips.saturating_add(u32::from(counted));
                let wait = self.settings.retry_delay(trip, *after);
                Plan::Required(self.delayed(msg.body, meta, trip, wait))
            }
        }
    }

    /// `body` for this queue's delay queue, back in `wait`, as trip `trip`.
    fn delayed(&self, body: Vec<u8>, meta: &Meta, trip: u32, wait: Duration) -> Outgoing {
        let extra = vec![
            (h::TRIPS, trip.to_string()),
            (h::FIRST_SEEN, envelope::rfc3339(meta.first_seen)),
        ];
        Outgoing {
            exchange: String::new(),
            routing_key: self.settings.delay_queue(self.queue),
            payload: body,
            properties: h::republished(&meta.properties, &extra)
                .with_expiration(h::expiration(wait)),
        }
    }

    fn reply_to(
        &self,
        reply_to: &str,
        meta: &Meta,
        decision: &Decision,
        stored: &StoredResult,
    ) -> Outgoing {
        let headers = envelope::reply_headers(decision, stored);
        let mut properties = BasicProperties::default()
            .with_headers(table_of(&headers))
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
            payload: envelope::reply_payload(decision, stored),
            properties,
        }
    }
}
