//! The RabbitMQ publisher of async routes: persistent messages, mandatory
//! routing and publisher confirms. Connects on first use and again after
//! any failure, so the API starts and answers while RabbitMQ is down.

use super::PublishError;
use crate::api::engine::Outgoing;
use crate::config::{AmqpSettings, SecretUrl};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use std::time::Duration;
use tokio::sync::Mutex;

/// Survives a broker restart in a durable queue.
const PERSISTENT: u8 = 2;

pub struct AmqpPublisher {
    url: SecretUrl,
    connect_timeout: Duration,
    /// The connection is kept with its channel: dropping it closes both.
    open: Mutex<Option<(Connection, Channel)>>,
}

impl AmqpPublisher {
    pub fn new(s: &AmqpSettings) -> Self {
        Self {
            url: s.url.clone(),
            connect_timeout: s.connect_timeout,
            open: Mutex::new(None),
        }
    }

    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut open = self.open.lock().await;
        if let Some((_, channel)) = open.as_ref().filter(|(_, c)| c.status().connected()) {
            return Ok(channel.clone());
        }
        *open = None;
        let properties = ConnectionProperties::default().with_connection_name("dedupq-api".into());
        let connection = tokio::time::timeout(
            self.connect_timeout,
            Connection::connect(self.url.expose(), properties),
        )
        .await
        .map_err(|_| PublishError::AmqpConnectTimeout)?
        .map_err(PublishError::AmqpConnect)?;
        let channel = connection
            .create_channel()
            .await
            .map_err(PublishError::AmqpChannel)?;
        channel
            .confirm_select(ConfirmSelectOptions { nowait: false })
            .await
            .map_err(PublishError::AmqpChannel)?;
        *open = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// Forgets a failed connection; the next publish opens a new one.
    async fn reset(&self) {
        *self.open.lock().await = None;
    }

    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        m: &Outgoing,
    ) -> Result<(), PublishError> {
        let channel = self.channel().await?;
        let mut headers = FieldTable::default();
        for (name, value) in &m.headers {
            let value = AMQPValue::LongString(LongString::from(value.clone()));
            headers.insert(name.as_str().into(), value);
        }
        let properties = BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(PERSISTENT)
            .with_content_type("application/json".into());
        let options = BasicPublishOptions {
            // An unroutable command comes back instead of vanishing.
            mandatory: true,
            immediate: false,
        };
        let confirmed = match channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                &m.body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        let unconfirmed = |why: String| PublishError::AmqpUnconfirmed {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            why,
        };
        match confirmed {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(unconfirmed(format!(
                "no queue is bound for it ({})",
                returned.reply_text
            ))),
            Ok(Confirmation::Nack(_)) => Err(unconfirmed("the broker refused it (nack)".into())),
            Ok(Confirmation::NotRequested) => Err(unconfirmed("confirms are off".into())),
            Err(e) => {
                self.reset().await;
                Err(PublishError::AmqpChannel(e))
            }
        }
    }
}
