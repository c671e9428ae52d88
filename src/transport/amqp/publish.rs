//! Publishing with publisher confirms: a publish counts only once the
//! broker has confirmed it and routed it to a queue (mandatory).

use super::error::AmqpError;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};

pub(super) struct Outgoing {
    pub exchange: String,
    pub routing_key: String,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
}

impl Outgoing {
    pub(super) fn destination(&self) -> String {
        format!("exchange '{}' key '{}'", self.exchange, self.routing_key)
    }
}

/// A channel in confirm mode, used only for publishing.
pub(super) struct Publisher {
    channel: Channel,
}

impl Publisher {
    pub(super) async fn open(connection: &Connection) -> Result<Self, AmqpError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::channel("channel.open"))?;
        channel
            .confirm_select(ConfirmSelectOptions { nowait: false })
            .await
            .map_err(AmqpError::channel("confirm.select"))?;
        Ok(Self { channel })
    }

    /// Sends every message, then waits for all their confirms. The result
    /// of each is in input order.
    pub(super) async fn publish_all(&self, batch: &[&Outgoing]) -> Vec<Result<(), AmqpError>> {
        let mut pending = Vec::with_capacity(batch.len());
        for out in batch {
            pending.push(self.send(out).await);
        }
        let waits = pending
            .into_iter()
            .zip(batch)
            .map(|(sent, out)| async move {
                let confirm = sent?;
                settle(out, confirm.await)
            });
        futures::future::join_all(waits).await
    }

    async fn send(&self, out: &Outgoing) -> Result<PublisherConfirm, AmqpError> {
        let (exchange, routing_key) = (short(&out.exchange, out)?, short(&out.routing_key, out)?);
        let options = BasicPublishOptions {
            // Unroutable messages come back instead of vanishing.
            mandatory: true,
            // Not supported by RabbitMQ.
            immediate: false,
        };
        self.channel
            .basic_publish(
                exchange,
                routing_key,
                options,
                &out.payload,
                out.properties.clone(),
            )
            .await
            .map_err(AmqpError::channel("basic.publish"))
    }
}

fn short(name: &str, out: &Outgoing) -> Result<lapin::types::ShortString, AmqpError> {
    lapin::types::ShortString::try_new(name).map_err(|_| AmqpError::Unconfirmed {
        destination: out.destination(),
        why: "name longer than 255 bytes".into(),
    })
}

fn settle(out: &Outgoing, confirmation: lapin::Result<Confirmation>) -> Result<(), AmqpError> {
    let unconfirmed = |why: String| AmqpError::Unconfirmed {
        destination: out.destination(),
        why,
    };
    match confirmation.map_err(AmqpError::channel("publisher confirm"))? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => {
            Err(unconfirmed(format!("returned: {}", returned.reply_text)))
        }
        Confirmation::Nack(_) => Err(unconfirmed("the broker refused it (nack)".into())),
        Confirmation::NotRequested => Err(unconfirmed("confirms are not enabled".into())),
    }
}
