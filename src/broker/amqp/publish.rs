//! Publishing with publisher confirms, for every lapin publisher of dedupq:
//! a publish counts only once the broker has confirmed it and routed it to
//! a queue (mandatory).

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ErrorKind, PublisherConfirm};
use std::sync::Arc;

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The exchange; empty for the default exchange (straight into the
    /// queue named by the routing key).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The body, byte for byte.
    pub payload: Vec<u8>,
    /// Properties and headers.
    pub properties: BasicProperties,
}

impl Outgoing {
    /// Exchange and routing key, for errors and logs.
    pub fn destination(&self) -> String {
        format!("exchange '{}' key '{}'", self.exchange, self.routing_key)
    }
}

/// Why a publish does not count. The variant decides: `Channel` means the
/// channel (or its connection) is gone and must be opened again;
/// `Unconfirmed` is the broker's answer about this one message.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// An AMQP method failed: the channel or its connection is gone.
    #[error("RabbitMQ operation `{op}` failed")]
    Channel {
        /// The AMQP method, such as `basic.publish`.
        op: &'static str,
        /// What lapin said.
        #[source]
        source: lapin::Error,
    },
    /// Nacked, returned as unroutable, or a name too long for AMQP.
    #[error("publish to {destination} was not confirmed: {why}")]
    Unconfirmed {
        /// Exchange and routing key.
        destination: String,
        /// Why the broker did not take it.
        why: String,
    },
}

/// The `op` of a [`PublishError::Channel`] that came while waiting for the
/// broker's confirm, after the message was written.
const CONFIRM_WAIT: &str = "publisher confirm";

impl PublishError {
    /// Whether the broker may have the message although it did not confirm
    /// it: the channel went while waiting for the confirm, after the
    /// message was written (a blocked connection writes it once its alarm
    /// clears).
    pub fn may_have_reached_the_broker(&self) -> bool {
        matches!(self, PublishError::Channel { op, .. } if *op == CONFIRM_WAIT)
    }

    /// Whether the broker closed the channel with 403 ACCESS_REFUSED: the
    /// user may not publish there (no `write` on the exchange). It closes
    /// the channel, not the connection, and stays so until an operator
    /// grants the permission.
    pub fn access_refused(&self) -> bool {
        let PublishError::Channel { source, .. } = self else {
            return false;
        };
        matches!(source.kind(), ErrorKind::ProtocolError(e)
            if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)))
    }
}

fn channel_error(op: &'static str) -> impl FnOnce(lapin::Error) -> PublishError {
    move |source| PublishError::Channel { op, source }
}

/// A channel in confirm mode, used only for publishing.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
}

/// A message sent and not yet confirmed.
pub struct Pending {
    destination: String,
    confirm: PublisherConfirm,
}

impl Publisher {
    /// Opens a channel on `connection` and puts it in confirm mode.
    pub async fn open(connection: &Connection) -> Result<Self, PublishError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(channel_error("channel.open"))?;
        channel
            .confirm_select(ConfirmSelectOptions { nowait: false })
            .await
            .map_err(channel_error("confirm.select"))?;
        Ok(Self { channel })
    }

    /// Whether the channel (and so its connection) is still open.
    pub fn is_open(&self) -> bool {
        self.channel.status().connected()
    }

    /// The confirm-mode channel, for declares next to the publishes.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `out` and waits for its confirm.
    pub async fn publish(&self, out: &Outgoing) -> Result<(), PublishError> {
        self.send(out).await?.confirmed().await
    }

    /// Sends every message, then waits for all their confirms. The result
    /// of each is in input order.
    pub async fn publish_all(&self, batch: &[&Outgoing]) -> Vec<Result<(), PublishError>> {
        let mut pending = Vec::with_capacity(batch.len());
        for out in batch {
            pending.push(self.send(out).await);
        }
        let waits = pending.into_iter().map(|sent| async move {
            match sent {
                Ok(pending) => pending.confirmed().await,
                Err(e) => Err(e),
            }
        });
        futures::future::join_all(waits).await
    }

    /// Sends `out` (mandatory) without waiting for its confirm, so that a
    /// publisher can keep a window of them in flight.
    pub async fn send(&self, out: &Outgoing) -> Result<Pending, PublishError> {
        let short = |name: &str| {
            ShortString::try_new(name).map_err(|_| PublishError::Unconfirmed {
                destination: out.destination(),
                why: "name longer than 255 bytes".into(),
            })
        };
        let (exchange, routing_key) = (short(&out.exchange)?, short(&out.routing_key)?);
        let options = BasicPublishOptions {
            // Unroutable messages come back instead of vanishing.
            mandatory: true,
            // Not supported by RabbitMQ.
            immediate: false,
        };
        let confirm = self
            .channel
            .basic_publish(
                exchange,
                routing_key,
                options,
                &out.payload,
                out.properties.clone(),
            )
            .await
            .map_err(channel_error("basic.publish"))?;
        Ok(Pending {
            destination: out.destination(),
            confirm,
        })
    }
}

/// A [`Publisher`] whose channel is opened again on the same connection
/// once the broker has closed it: a refused publish closes its channel,
/// and the connection and the consumers on it go on.
pub struct Reopening {
    connection: Arc<Connection>,
    current: tokio::sync::Mutex<Publisher>,
}

impl Reopening {
    pub async fn open(connection: Arc<Connection>) -> Result<Self, PublishError> {
        let publisher = Publisher::open(&connection).await?;
        Ok(Self {
            connection,
            current: tokio::sync::Mutex::new(publisher),
        })
    }

    /// The publisher in use, whatever the state of its channel.
    pub async fn current(&self) -> Publisher {
        self.current.lock().await.clone()
    }

    /// The publisher in use, on a new channel if the broker closed the
    /// old one while the connection lives.
    pub async fn live(&self) -> Result<Publisher, PublishError> {
        let mut current = self.current.lock().await;
        if !current.is_open() && self.connection.status().connected() {
            *current = Publisher::open(&self.connection).await?;
            tracing::info!("opened a new publishing channel; the broker had closed the last one");
        }
        Ok(current.clone())
    }
}

impl Pending {
    /// Waits for the broker's confirm: Ok only if it acked the message and
    /// did not return it as unroutable.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        let unconfirmed = |why: String| PublishError::Unconfirmed {
            destination: self.destination.clone(),
            why,
        };
        match self.confirm.await.map_err(channel_error(CONFIRM_WAIT))? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(unconfirmed(format!(
                "no queue took it (returned: {})",
                returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(unconfirmed("the broker refused it (nack)".into())),
            Confirmation::NotRequested => Err(unconfirmed("confirms are not enabled".into())),
        }
    }
}
