//! RabbitMQ dead letters. The queue is read with basic.get and nothing is
//! acked while listing: closing the channel puts every message back. A
//! replay publishes to the source queue (default exchange, mandatory, with
//! publisher confirms) and acks the dead letter only once the broker
//! confirmed the copy was routed, so a failed replay leaves it in place.

use super::record::{self, DeadLetter, Filter, IdentityHeaders};
use super::DlqError;
use crate::config::AmqpSettings;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

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

pub struct AmqpLetter {
    pub letter: DeadLetter,
    delivery: Delivery,
}

/// An open channel on the dead-letter queue; dropping it (or `close`)
/// returns every message not acked.
pub struct Session {
    connection: Connection,
    channel: Channel,
    identity: IdentityHeaders,
}

impl Session {
    pub async fn open(
        settings: &AmqpSettings,
        identity: IdentityHeaders,
    ) -> Result<Self, DlqError> {
        let connection = Connection::connect(
            settings.url.expose(),
            ConnectionProperties::default().with_connection_name("dedupq-dlq".into()),
        )
        .await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            connection,
            channel,
            identity,
        })
    }

    /// Takes every message now in `queue` (unacked), keeps those that pass
    /// `filter`, at most `limit`.
    pub async fn read(
        &self,
        queue: &str,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<AmqpLetter>, DlqError> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let present = self
            .channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map_err(|e| DlqError::NoQueue(queue.to_string(), e))?
            .message_count();
        let mut out = Vec::new();
        for n in 0..present {
            if out.len() >= limit {
                break;
            }
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await?;
            let Some(got) = got else { break };
            let letter = letter(queue, n, &got.delivery, &self.identity);
            if filter.matches(&letter) {
                out.push(AmqpLetter {
                    letter,
                    delivery: got.delivery,
                });
            }
        }
        Ok(out)
    }

    /// Publishes each letter to its source queue; acks it in the dead-letter
    /// queue once the broker confirmed the replay.
    pub async fn replay(&self, letters: &mut [AmqpLetter]) -> Result<(), DlqError> {
        for l in letters.iter_mut() {
            let Some(queue) = l.letter.source.clone() else {
                l.letter.replay = Some("skipped: no source queue".into());
                continue;
            };
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    // Unroutable (the queue is gone) comes back instead of
                    // being dropped, and the dead letter stays.
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &l.delivery.data,
                    original(&l.delivery.properties),
                )
                .await?
                .await?;
            let routed = confirm.is_ack() && confirm.take_message().is_none();
            l.letter.replay = Some(if !routed {
                format!("failed: {queue} did not take it; left in the dead-letter queue")
            } else if l.delivery.acker.ack(BasicAckOptions::default()).await? {
                format!("replayed to {queue}")
            } else {
                format!("replayed to {queue}; the dead letter could not be removed")
            });
        }
        Ok(())
    }

    /// Puts back every message not acked.
    pub async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// The message as it was first published: the same properties and headers
/// without dedupq's diagnostics and the broker's dead-letter history.
fn original(p: &BasicProperties) -> BasicProperties {
    let mut p = p.clone();
    if let Some(headers) = p.headers() {
        let kept: std::collections::BTreeMap<_, _> = headers
            .inner()
            .iter()
            .filter(|(k, _)| {
                let k = k.as_str();
                !k.starts_with(record::DIAGNOSTIC_PREFIX) && !BROKER_HEADERS.contains(&k)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        p = p.with_headers(FieldTable::from(kept));
    }
    p
}

fn letter(queue: &str, n: u32, d: &Delivery, identity: &IdentityHeaders) -> DeadLetter {
    let headers = d.properties.headers().as_ref();
    let get = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(value_text)
    };
    let death = headers.and_then(first_death);
    let death_field = |name: &str| death.and_then(|t| t.inner().get(name)).and_then(value_text);
    let first_seen = get(record::FIRST_SEEN)
        .and_then(|t| record::time(&t))
        .or_else(|| {
            death
                .and_then(|t| t.inner().get("time"))
                .and_then(timestamp)
        })
        .or_else(|| {
            d.properties
                .timestamp()
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
        bytes: d.data.len(),
        replay: None,
    }
}

/// The oldest entry of `x-death` (the broker puts the newest first).
fn first_death(headers: &FieldTable) -> Option<&FieldTable> {
    match headers.inner().get("x-death")? {
        AMQPValue::FieldArray(entries) => entries.as_slice().iter().rev().find_map(|e| match e {
            AMQPValue::FieldTable(t) => Some(t),
            _ => None,
        }),
        _ => None,
    }
}

fn value_text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(record::text(s.as_bytes())),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        _ => None,
    }
}

fn timestamp(v: &AMQPValue) -> Option<chrono::DateTime<chrono::Utc>> {
    match v {
        AMQPValue::Timestamp(t) => chrono::DateTime::from_timestamp(*t as i64, 0),
        _ => None,
    }
}
