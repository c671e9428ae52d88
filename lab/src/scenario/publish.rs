//! Publishing the workload: Kafka with delivery reports (to know every
//! message's partition and offset), RabbitMQ with publisher confirms and a
//! reconnect, as a careful producer would.

use super::workload::{Hostile, Planned, ReplyTo, Route};
use anyhow::{anyhow, Context};
use dedupq::broker::amqp::raw::{self, FieldValue, RawProperties};
use dedupq::broker::amqp::{self, Outgoing, Publisher};
use dedupq::broker::kafka::{self, headers};
use dedupq::config::{AmqpSettings, KafkaSettings};
use dedupq::message::Header;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::time::Duration;

/// Where a Kafka message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Coordinates {
    pub partition: i32,
    pub offset: i64,
}

pub(super) struct KafkaPublisher {
    producer: FutureProducer,
    topic: String,
}

impl KafkaPublisher {
    pub(super) fn new(brokers: &str, topic: &str) -> anyhow::Result<Self> {
        let producer = kafka::client(&KafkaSettings::at(brokers), "dedupq-scenario")
            // Every copy must land: wait for the broker, and keep retrying
            // through a broker restart.
            .set("acks", "all")
            .set("message.timeout.ms", "180000")
            .set("linger.ms", "2")
            .create()
            .context("creating the Kafka producer")?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }

    pub(super) async fn publish(&self, msg: &Planned) -> anyhow::Result<Coordinates> {
        let mut headers = Vec::new();
        if let Some(t) = &msg.tenant {
            headers.push(Header::new("client-id", t.as_bytes()));
        }
        if let Some(k) = &msg.key {
            headers.push(Header::new("idempotency-key", k.as_bytes()));
        }
        match msg.hostile {
            Some(Hostile::KafkaBadHeaderName) => {
                headers.push(Header::new(&b"x-trace-\xff\xfe"[..], &b"1"[..]));
            }
            Some(Hostile::KafkaTwoKeys) => {
                headers.push(Header::new("idempotency-key", &b"another-key"[..]));
            }
            _ => {}
        }
        let mut record = FutureRecord::<str, [u8]>::to(&self.topic)
            .payload(&msg.body)
            .headers(headers::owned(&headers));
        if let (Route::Kafka, Some(k)) = (msg.route, &msg.key) {
            record = record.key(k.as_str());
        }
        let delivery = self
            .producer
            .send(record, Duration::from_secs(60))
            .await
            .map_err(|(e, _)| anyhow!("producing to {}: {e}", self.topic))?;
        Ok(Coordinates {
            partition: delivery.partition,
            offset: delivery.offset,
        })
    }
}

/// Longest wait for one RabbitMQ publish to be confirmed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct AmqpPublisher {
    settings: AmqpSettings,
    queue: String,
    /// `reply_to` for `ReplyTo::Full` (a queue that refuses every publish)
    /// and `ReplyTo::Missing`.
    pub reply_full: String,
    pub reply_missing: String,
    open: Option<(Connection, Publisher)>,
    /// Publishes repeated after a lost connection (the broker may have the
    /// first copy too: a producer duplicate, which dedupq must absorb).
    pub republished: usize,
}

impl AmqpPublisher {
    pub(super) fn new(url: &str, queue: &str) -> Self {
        Self {
            settings: AmqpSettings::at(url),
            queue: queue.to_string(),
            reply_full: format!("{queue}.full-replies"),
            reply_missing: format!("{queue}.missing-replies"),
            open: None,
            republished: 0,
        }
    }

    async fn publisher(&mut self) -> anyhow::Result<&Publisher> {
        if self
            .open
            .as_ref()
            .is_none_or(|(c, p)| !c.status().connected() || !p.is_open())
        {
            let connection = amqp::connect(&self.settings, "dedupq-scenario-publisher")
                .await
                .context("connecting to RabbitMQ")?;
            let publisher = Publisher::open(&connection).await?;
            self.open = Some((connection, publisher));
        }
        Ok(&self.open.as_ref().expect("set above").1)
    }

    /// Declares the queue that refuses every reply (no room, overflow
    /// rejects the publish).
    pub(super) async fn declare_full_replies(&mut self) -> anyhow::Result<()> {
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(0));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let name = ShortString::from(self.reply_full.clone());
        let publisher = self.publisher().await?;
        publisher
            .channel()
            .queue_declare(name, lapin::options::QueueDeclareOptions::default(), args)
            .await
            .context("declaring the queue that refuses replies")?;
        Ok(())
    }

    /// Publishes until the broker confirms it, reconnecting as needed.
    pub(super) async fn publish(&mut self, msg: &Planned) -> anyhow::Result<()> {
        if matches!(
            msg.hostile,
            Some(Hostile::AmqpBadMessageId | Hostile::AmqpBadHeaderName)
        ) {
            return self.publish_unreadable(msg).await;
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            // A confirm lost with a force-closed connection may never
            // resolve: bound each try, then reconnect and publish again.
            let tried = tokio::time::timeout(PUBLISH_TIMEOUT, self.try_publish(msg)).await;
            match tried.unwrap_or_else(|_| Err(anyhow!("no confirm within {PUBLISH_TIMEOUT:?}"))) {
                Ok(()) => return Ok(()),
                Err(e) if attempts < 60 => {
                    tracing::debug!(error = %dedupq::telemetry::chain(e.as_ref()), "publish to RabbitMQ failed; reconnecting");
                    self.open = None;
                    self.republished += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A delivery lapin cannot parse, published byte by byte.
    async fn publish_unreadable(&self, msg: &Planned) -> anyhow::Result<()> {
        let text = |v: &[u8]| FieldValue::LongStr(v.to_vec());
        let tenant = msg.tenant.as_deref().unwrap_or_default().as_bytes();
        let key = msg.key.as_deref().unwrap_or_default().as_bytes();
        let mut headers = vec![
            (b"client-id".to_vec(), text(tenant)),
            (b"idempotency-key".to_vec(), text(key)),
        ];
        let mut message_id = None;
        if msg.hostile == Some(Hostile::AmqpBadMessageId) {
            message_id = Some(b"\xff\xfe-unreadable".to_vec());
        } else {
            headers.push((b"x-\xff\xfe".to_vec(), text(b"1")));
        }
        let properties = RawProperties {
            headers: Some(headers),
            delivery_mode: Some(2),
            message_id,
            ..RawProperties::default()
        };
        raw::publish_raw(&self.settings, &self.queue, &properties, &msg.body)
            .await
            .context("publishing an unreadable message byte by byte")
    }

    async fn try_publish(&mut self, msg: &Planned) -> anyhow::Result<()> {
        let mut headers = BTreeMap::new();
        if let Some(t) = &msg.tenant {
            headers.insert(
                ShortString::from("client-id"),
                AMQPValue::LongString(t.as_str().into()),
            );
        }
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if let Some(k) = &msg.key {
            // Half through the header, half through message_id: both are
            // places a producer may put the key.
            if k.len() % 2 == 0 {
                headers.insert(
                    ShortString::from("idempotency-key"),
                    AMQPValue::LongString(k.as_str().into()),
                );
            } else if let Ok(id) = ShortString::try_new(k.as_str()) {
                props = props.with_message_id(id);
            } else {
                headers.insert(
                    ShortString::from("idempotency-key"),
                    AMQPValue::LongString(k.as_str().into()),
                );
            }
        }
        if let (Some(Hostile::AmqpTwoTenants), Some(t)) = (msg.hostile, &msg.tenant) {
            // A second tenant header that differs only in case: two entries
            // of the table, one payment named two ways.
            headers.insert(
                ShortString::from("Client-Id"),
                AMQPValue::LongString(format!("{t}-other").into()),
            );
        }
        match msg.reply_to {
            Some(ReplyTo::Full) => {
                props = props.with_reply_to(self.reply_full.clone().into());
            }
            Some(ReplyTo::Missing) => {
                props = props.with_reply_to(self.reply_missing.clone().into());
            }
            None => {}
        }
        let out = Outgoing {
            exchange: String::new(),
            routing_key: self.queue.clone(),
            payload: msg.body.clone(),
            properties: props.with_headers(FieldTable::from(headers)),
        };
        Ok(self.publisher().await?.publish(&out).await?)
    }
}
