//! The RabbitMQ objects dedupq relies on: per work queue a delay queue that
//! dead-letters back to it, and one dead-letter exchange with its queue.

use super::error::AmqpError;
use crate::config::{AmqpSettings, QueueType, Topology};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Connection, ExchangeKind};

/// Declares or verifies everything, on a channel of its own (a failed
/// declare closes the channel it ran on).
pub(super) async fn prepare(
    connection: &Connection,
    settings: &AmqpSettings,
) -> Result<(), AmqpError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::channel("channel.open"))?;
    let plan = Plan { settings };
    match settings.topology {
        Topology::Declare => plan.declare(&channel).await?,
        Topology::Verify => plan.verify(&channel).await?,
    }
    // Best effort: the topology is in place whether or not this close lands.
    let _ = channel.close(200, "topology ready".into()).await;
    Ok(())
}

/// Connects, declares or verifies the topology, and disconnects: for a
/// tool that publishes to dedupq's queues before dedupq starts (the
/// benchmark), so both agree on every queue argument.
pub async fn prepare_alone(settings: &AmqpSettings) -> Result<(), AmqpError> {
    let connection = crate::broker::amqp::connect(settings, &settings.connection_name).await?;
    let prepared = prepare(&connection, settings).await;
    let _ = connection.close(200, "topology ready".into()).await;
    prepared
}

struct Plan<'a> {
    settings: &'a AmqpSettings,
}

impl Plan<'_> {
    async fn declare(&self, channel: &lapin::Channel) -> Result<(), AmqpError> {
        let s = self.settings;
        // Topic, so operators can bind extra queues per work queue.
        channel
            .exchange_declare(
                s.dead_letter_exchange.as_str().into(),
                ExchangeKind::Topic,
                durable_exchange(false),
                FieldTable::default(),
            )
            .await
            .map_err(topology_error("exchange", &s.dead_letter_exchange))?;
        self.queue(channel, &s.dead_letter_queue, self.base_arguments(), false)
            .await?;
        channel
            .queue_bind(
                s.dead_letter_queue.as_str().into(),
                s.dead_letter_exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(topology_error("binding of", &s.dead_letter_queue))?;
        for queue in &s.queues {
            self.queue(channel, queue, self.work_arguments(), false)
                .await?;
            let delay = s.delay_queue(queue);
            self.queue(channel, &delay, self.delay_arguments(queue), false)
                .await?;
        }
        Ok(())
    }

    async fn verify(&self, channel: &lapin::Channel) -> Result<(), AmqpError> {
        let s = self.settings;
        channel
            .exchange_declare(
                s.dead_letter_exchange.as_str().into(),
                ExchangeKind::Topic,
                durable_exchange(true),
                FieldTable::default(),
            )
            .await
            .map_err(topology_error("exchange", &s.dead_letter_exchange))?;
        self.queue(channel, &s.dead_letter_queue, FieldTable::default(), true)
            .await?;
        for queue in &s.queues {
            self.queue(channel, queue, FieldTable::default(), true)
                .await?;
            self.queue(channel, &s.delay_queue(queue), FieldTable::default(), true)
                .await?;
        }
        Ok(())
    }

    async fn queue(
        &self,
        channel: &lapin::Channel,
        name: &str,
        arguments: FieldTable,
        passive: bool,
    ) -> Result<(), AmqpError> {
        let options = QueueDeclareOptions {
            passive,
            // Survive a broker restart (quorum queues must be durable).
            durable: true,
            // Shared by every dedupq instance and outliving each of them.
            exclusive: false,
            auto_delete: false,
            // Wait for declare-ok so a mismatch is reported here.
            nowait: false,
        };
        channel
            .queue_declare(name.into(), options, arguments)
            .await
            .map(|_| ())
            .map_err(topology_error("queue", name))
    }

    fn base_arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        // Explicit even for classic, so a mismatch with an existing queue is
        // reported instead of silently consuming from another type.
        args.insert(
            "x-queue-type".into(),
            text(self.settings.queue_type.as_str()),
        );
        args
    }

    /// A work queue. Quorum queues count deliveries; past
    /// `amqp.delivery_limit` the broker itself dead-letters the message to
    /// dedupq's dead-letter exchange (`x-death` reason `delivery_limit`).
    /// That bounds what dedupq cannot even read (properties that are not
    /// UTF-8 break the client's connection, so no code of dedupq ever sees
    /// the delivery). Everything dedupq can read it dead-letters itself,
    /// with a reason, long before.
    fn work_arguments(&self) -> FieldTable {
        let s = self.settings;
        let mut args = self.base_arguments();
        if s.queue_type == QueueType::Quorum {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(s.delivery_limit.into()),
            );
            args.insert(
                "x-dead-letter-exchange".into(),
                text(&s.dead_letter_exchange),
            );
            // The dead letter is kept until the dead-letter queue confirms
            // it (at-least-once needs reject-publish overflow).
            args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
            args.insert("x-overflow".into(), text("reject-publish"));
        }
        args
    }

    /// A delay queue: messages wait out their per-message TTL, then the
    /// broker dead-letters them to the default exchange with the work
    /// queue's name as routing key, i.e. back to the work queue. Nobody
    /// consumes it.
    fn delay_arguments(&self, work_queue: &str) -> FieldTable {
        let mut args = self.base_arguments();
        args.insert("x-dead-letter-exchange".into(), text(""));
        args.insert("x-dead-letter-routing-key".into(), text(work_queue));
        if self.settings.queue_type == QueueType::Quorum {
            // Quorum queues dead-letter at most once by default; at-least-once
            // keeps the message until the work queue confirms it, and requires
            // reject-publish overflow.
            args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
            args.insert("x-overflow".into(), text("reject-publish"));
        }
        args
    }
}

fn durable_exchange(passive: bool) -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        passive,
        durable: true,
        auto_delete: false,
        // Producers other than dedupq may publish dead letters too.
        internal: false,
        nowait: false,
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn topology_error(kind: &'static str, name: &str) -> impl FnOnce(lapin::Error) -> AmqpError {
    let name = name.to_string();
    move |source| AmqpError::Topology {
        what: format!(
            "{kind} '{name}' is missing or declared with other arguments \
             (amqp.topology = \"declare\" creates it; an existing queue of another \
             type or with other arguments must be migrated or named differently)"
        ),
        source,
    }
}

/// The queues and the exchange dedupq relies on that the broker does not
/// have, each found by a passive declare on a channel of its own (a failed
/// passive declare closes its channel): for `dedupq check`. Connecting
/// tries the configured URL, TLS and credentials as `dedupq run` will.
pub async fn missing_objects(settings: &AmqpSettings) -> Result<Vec<String>, AmqpError> {
    let connection = crate::broker::amqp::connect(settings, "dedupq check").await?;
    let mut queues = vec![settings.dead_letter_queue.clone()];
    for queue in &settings.queues {
        queues.push(queue.clone());
        queues.push(settings.delay_queue(queue));
    }
    let mut missing = Vec::new();
    let exchange = passive(&connection, |channel| async move {
        channel
            .exchange_declare(
                settings.dead_letter_exchange.as_str().into(),
                ExchangeKind::Topic,
                durable_exchange(true),
                FieldTable::default(),
            )
            .await
    });
    if !exchange.await? {
        missing.push(format!("exchange {}", settings.dead_letter_exchange));
    }
    for queue in queues {
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let name = queue.clone();
        let found = passive(&connection, |channel| async move {
            channel
                .queue_declare(name.as_str().into(), options, FieldTable::default())
                .await
                .map(|_| ())
        });
        if !found.await? {
            missing.push(format!("queue {queue}"));
        }
    }
    let _ = connection.close(200, "checked".into()).await;
    Ok(missing)
}

/// Runs one passive declare on a fresh channel: `false` if the broker
/// answered that the object does not exist (404), an error otherwise.
async fn passive<F, Fut>(connection: &Connection, declare: F) -> Result<bool, AmqpError>
where
    F: FnOnce(lapin::Channel) -> Fut,
    Fut: std::future::Future<Output = Result<(), lapin::Error>>,
{
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::channel("channel.open"))?;
    match declare(channel.clone()).await {
        Ok(()) => {
            let _ = channel.close(200, "checked".into()).await;
            Ok(true)
        }
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(AmqpError::channel("declare (passive)")(e)),
    }
}

fn is_not_found(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        e.kind(),
        lapin::ErrorKind::ProtocolError(p) if matches!(p.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}
