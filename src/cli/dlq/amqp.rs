//! RabbitMQ dead letters, read and replayed with the raw AMQP client
//! (`broker::amqp::raw`): every property and header is read as bytes, so a
//! delivery lapin cannot parse (the non-UTF-8 poison the broker
//! dead-letters by its delivery limit) is listed like any other instead of
//! breaking the connection. Nothing is acked while listing: closing the
//! connection puts every message back. A replay publishes to the source
//! queue (default exchange, mandatory, with publisher confirms) with the
//! original properties byte for byte, and acks the dead letter only once
//! the broker confirmed the copy was routed, so a failed replay leaves it
//! in place. A letter lapin cannot parse is not replayed: dedupq's consumer
//! could not read it either, and it would only be dead-lettered again.

use super::record::{self, DeadLetter, Filter, IdentityHeaders};
use super::DlqError;
use crate::broker::amqp::raw::{FieldValue, RawAmqp, RawAmqpError, RawDelivery, Table};
use crate::config::AmqpSettings;

/// Headers the broker adds on dead-lettering and redelivery: history, not
/// part of the original message, dropped on replay like `dedupq-*`.
const BROKER_HEADERS: [&str; 8] = [
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-delivery-count",
];

pub(super) struct AmqpLetter {
    pub letter: DeadLetter,
    delivery: RawDelivery,
}

/// A connection holding the dead letters it took; closing it (or dropping
/// it) returns every one not acked.
pub(super) struct Session {
    raw: RawAmqp,
    identity: IdentityHeaders,
}

impl Session {
    pub(super) async fn open(
        settings: &AmqpSettings,
        identity: IdentityHeaders,
    ) -> Result<Self, DlqError> {
        Ok(Self {
            raw: RawAmqp::connect(settings, "dedupq-dlq").await?,
            identity,
        })
    }

    /// Takes every message now in `queue` (unacked), keeps those that pass
    /// `filter`, at most `limit`.
    pub(super) async fn read(
        &mut self,
        queue: &str,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<AmqpLetter>, DlqError> {
        let present = match self.raw.message_count(queue).await {
            Err(RawAmqpError::Closed { code: 404, .. }) => {
                return Err(DlqError::NoQueue(queue.to_string()))
            }
            other => other?,
        };
        let mut out = Vec::new();
        for n in 0..present {
            if out.len() >= limit {
                break;
            }
            let Some(delivery) = self.raw.get_unacked(queue).await? else {
                break;
            };
            let letter = letter(queue, n, &delivery, &self.identity);
            if filter.matches(&letter) {
                out.push(AmqpLetter { letter, delivery });
            }
        }
        Ok(out)
    }

    /// Publishes each letter to its source queue; acks it in the dead-letter
    /// queue once the broker confirmed the replay was routed.
    pub(super) async fn replay(&mut self, letters: &mut [AmqpLetter]) -> Result<(), DlqError> {
        for l in letters.iter_mut() {
            l.letter.replay = Some(match plan(&l.letter) {
                Err(skipped) => skipped,
                Ok(queue) => self.replay_one(&queue, &l.delivery).await?,
            });
        }
        Ok(())
    }

    async fn replay_one(&mut self, queue: &str, d: &RawDelivery) -> Result<String, DlqError> {
        let mut properties = d.properties.clone();
        if let Some(headers) = properties.headers.as_mut() {
            headers.retain(|(name, _)| original(name));
        }
        match self.raw.publish("", queue, &properties, &d.body).await {
            Ok(()) => {}
            // Unroutable (the queue is gone) or refused: the dead letter stays.
            Err(RawAmqpError::Unroutable { .. } | RawAmqpError::Nacked) => {
                return Ok(format!(
                    "failed: {queue} did not take it; left in the dead-letter queue"
                ))
            }
            Err(e) => return Err(e.into()),
        }
        self.raw.ack(d.delivery_tag).await?;
        Ok(format!("replayed to {queue}"))
    }

    /// Puts back every message not acked.
    pub(super) async fn close(self) {
        let _ = self.raw.close().await;
    }
}

/// Where a replay goes, or why the letter is skipped.
fn plan(letter: &DeadLetter) -> Result<String, String> {
    if let Some(why) = &letter.unreadable {
        return Err(format!(
            "skipped: {why}, which dedupq's consumer cannot read; left in the dead-letter queue"
        ));
    }
    letter
        .source
        .clone()
        .ok_or_else(|| "skipped: no source queue".to_string())
}

/// What a dry run says for each letter.
pub(super) fn dry_run(letters: &mut [AmqpLetter]) {
    for l in letters {
        l.letter.replay = Some(match plan(&l.letter) {
            Ok(queue) => format!("would replay to {queue}"),
            Err(skipped) => format!("would be {skipped}"),
        });
    }
}

/// Whether a header is part of the message as first published: not one of
/// dedupq's diagnostics nor of the broker's dead-letter history.
fn original(name: &[u8]) -> bool {
    !name.starts_with(record::DIAGNOSTIC_PREFIX.as_bytes())
        && !BROKER_HEADERS.iter().any(|b| b.as_bytes() == name)
}

fn letter(queue: &str, n: u32, d: &RawDelivery, identity: &IdentityHeaders) -> DeadLetter {
    let p = &d.properties;
    let headers: &[(Vec<u8>, FieldValue)] = p.headers.as_deref().unwrap_or_default();
    let get = |name: &str| field(headers, name).and_then(value_text);
    let death = first_death(headers);
    let death_field = |name: &str| death.and_then(|t| field(t, name)).and_then(value_text);
    let first_seen = get(record::FIRST_SEEN)
        .and_then(|t| record::time(&t))
        .or_else(|| death.and_then(|t| field(t, "time")).and_then(timestamp))
        .or_else(|| {
            p.timestamp
                .and_then(|t| chrono::DateTime::from_timestamp(t as i64, 0))
        });
    DeadLetter {
        location: format!("{queue}#{n}"),
        reason: get(record::REASON)
            .or_else(|| get("x-first-death-reason"))
            .or_else(|| death_field("reason")),
        tenant: get(record::TENANT).or_else(|| identity.tenant.as_deref().and_then(get)),
        key: get(record::KEY).or_else(|| get(&identity.key)),
        first_seen,
        source: get(record::SOURCE_QUEUE)
            .or_else(|| get("x-first-death-queue"))
            .or_else(|| death_field("queue")),
        detail: get(record::DETAIL),
        bytes: d.body.len(),
        unreadable: p.unreadable(),
        replay: None,
    }
}

/// The first entry named `name`, compared byte for byte.
fn field<'a>(table: &'a [(Vec<u8>, FieldValue)], name: &str) -> Option<&'a FieldValue> {
    table
        .iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| v)
}

/// The oldest entry of `x-death` (the broker puts the newest first).
fn first_death(headers: &[(Vec<u8>, FieldValue)]) -> Option<&Table> {
    match field(headers, "x-death")? {
        FieldValue::Array(entries) => entries.iter().rev().find_map(|e| match e {
            FieldValue::Table(t) => Some(t),
            _ => None,
        }),
        _ => None,
    }
}

fn value_text(v: &FieldValue) -> Option<String> {
    match v {
        FieldValue::LongStr(s) | FieldValue::Bytes(s) => Some(record::text(s)),
        FieldValue::Long(n) => Some(n.to_string()),
        FieldValue::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn timestamp(v: &FieldValue) -> Option<chrono::DateTime<chrono::Utc>> {
    match v {
        FieldValue::Timestamp(t) => chrono::DateTime::from_timestamp(*t as i64, 0),
        _ => None,
    }
}
