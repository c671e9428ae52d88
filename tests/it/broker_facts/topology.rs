//! Queues for the facts, named `dqt_facts_*` (the test expiry policy
//! removes leftovers), and a lapin consumer session like dedupq's.

use crate::support::amqp::{amqp_url, Client};
use crate::support::raw_amqp::RawDelivery;
pub use crate::support::raw_amqp::{death_reason, take_all};
use crate::support::unique;
use dedupq::config::AmqpSettings;
use futures::stream::BoxStream;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, Consumer, Event, ExchangeKind};
use std::time::Duration;

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// Declares a durable quorum queue named `dqt_facts_<prefix>_…`.
pub async fn quorum_queue(client: &Client, prefix: &str, mut args: FieldTable) -> String {
    let name = unique(&format!("dqt_facts_{prefix}"));
    args.insert("x-queue-type".into(), text("quorum"));
    let channel = client.connection.create_channel().await.expect("channel");
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.as_str().into(), durable, args)
        .await
        .expect("declare a quorum queue");
    let _ = channel.close(200, "declared".into()).await;
    name
}

/// A work queue that RabbitMQ itself dead-letters after `limit` returns,
/// through a topic exchange bound with `#` to a dead-letter queue: the
/// arguments dedupq's work queues are to carry.
pub struct Limited {
    pub work: String,
    pub exchange: String,
    pub dead_letters: String,
}

/// The work queue's arguments for `limit` and the dead-letter `exchange`.
pub fn limit_arguments(limit: i32, exchange: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit));
    args.insert("x-dead-letter-exchange".into(), text(exchange));
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    args.insert("x-overflow".into(), text("reject-publish"));
    args
}

impl Limited {
    pub async fn declare(client: &Client, limit: i32) -> Self {
        let mut queues = Self::declare_without_limit(client).await;
        queues.work = quorum_queue(client, "work", limit_arguments(limit, &queues.exchange)).await;
        queues
    }

    /// The dead-letter side, and a work queue declared as dedupq declares
    /// it today: quorum, with no limit.
    pub async fn declare_without_limit(client: &Client) -> Self {
        let exchange = unique("dqt_facts_dlx");
        let channel = client.connection.create_channel().await.expect("channel");
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .expect("declare the dead-letter exchange");
        let dead_letters = quorum_queue(client, "dlq", FieldTable::default()).await;
        channel
            .queue_bind(
                dead_letters.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the dead-letter queue");
        let _ = channel.close(200, "declared".into()).await;
        let work = quorum_queue(client, "work", FieldTable::default()).await;
        Self {
            work,
            exchange,
            dead_letters,
        }
    }

    /// Takes every message now in the dead-letter queue, as bytes.
    pub async fn dead_lettered(&self) -> Vec<RawDelivery> {
        take_all(&self.dead_letters).await
    }
}

/// A lapin connection with one channel consuming one queue.
pub struct Consuming {
    pub connection: Connection,
    /// The connection's events, listened to from before the consumer
    /// started (lapin drops events no one listens to yet).
    pub events: BoxStream<'static, Event>,
    pub channel: Channel,
    pub consumer: Consumer,
}

/// Connects and consumes `queue` with manual acks and `prefetch`, as
/// dedupq does.
pub async fn open_consumer(queue: &str, prefetch: u16) -> Consuming {
    let connection = dedupq::broker::amqp::connect(&AmqpSettings::at(&amqp_url()), "dedupq-facts")
        .await
        .expect("lapin connect");
    let events = connection.events_listener().boxed();
    let channel = connection.create_channel().await.expect("channel");
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .expect("basic.qos");
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    Consuming {
        connection,
        events,
        channel,
        consumer,
    }
}

/// How a consumer session ended.
pub struct Session {
    /// What the consumer stream yielded before it failed or went quiet.
    pub received: Vec<Delivery>,
    /// The stream's error, if it failed.
    pub error: Option<lapin::Error>,
}

/// One connection, one channel with `prefetch`, one consumer on `queue`,
/// as dedupq opens them; collects deliveries (acking each on receipt when
/// `ack`, else holding them as a batch in progress) until the stream fails
/// or yields nothing for `quiet`. The connection is then closed (a no-op
/// if lapin already dropped it), returning what was not acked.
pub async fn consume_session(queue: &str, prefetch: u16, ack: bool, quiet: Duration) -> Session {
    let Consuming {
        connection,
        mut consumer,
        ..
    } = open_consumer(queue, prefetch).await;
    let mut session = Session {
        received: Vec::new(),
        error: None,
    };
    while let Ok(Some(next)) = tokio::time::timeout(quiet, consumer.next()).await {
        match next {
            Ok(delivery) => {
                if ack {
                    delivery
                        .acker
                        .ack(BasicAckOptions::default())
                        .await
                        .expect("ack");
                }
                session.received.push(delivery);
            }
            Err(e) => {
                session.error = Some(e);
                break;
            }
        }
    }
    let _ =
        tokio::time::timeout(Duration::from_secs(5), connection.close(200, "done".into())).await;
    session
}

/// Whether `e` is lapin's failure to parse a frame.
pub fn is_parsing_error(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ParsingError(_))
}
