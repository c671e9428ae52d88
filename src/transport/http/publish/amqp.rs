//! The RabbitMQ publisher of async routes: persistent messages, mandatory
//! routing and publisher confirms (`broker::amqp::Publisher`). Connects on
//! first use and again after any failure, so the API starts and answers
//! while RabbitMQ is down.

use super::PublishError;
use crate::broker::amqp::{self, Publisher};
use crate::config::AmqpSettings;
use crate::transport::http::decide::Publication;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};
use tokio::sync::Mutex;

/// Survives a broker restart in a durable queue.
const PERSISTENT: u8 = 2;

pub(crate) struct AmqpPublisher {
    settings: AmqpSettings,
    /// The connection is kept with its channel: dropping it closes both.
    open: Mutex<Option<(Connection, Publisher)>>,
}

impl AmqpPublisher {
    pub(crate) fn new(s: &AmqpSettings) -> Self {
        Self {
            settings: s.clone(),
            open: Mutex::new(None),
        }
    }

    async fn publisher(&self) -> Result<Publisher, PublishError> {
        let mut open = self.open.lock().await;
        if let Some((connection, publisher)) = open.as_ref().filter(|(_, p)| p.is_open()) {
            // Under a memory or disk alarm RabbitMQ blocks the connection,
            // and nothing written on it goes out until the alarm clears: a
            // request would hold its slot for api.request_timeout, and so
            // would every other one. Refused at once instead.
            if connection.status().blocked() {
                return Err(PublishError::AmqpBlocked);
            }
            return Ok(publisher.clone());
        }
        *open = None;
        let connection = amqp::connect(&self.settings, "dedupq-api").await?;
        let publisher = Publisher::open(&connection).await?;
        *open = Some((connection, publisher.clone()));
        Ok(publisher)
    }

    /// Forgets a failed connection; the next publish opens a new one.
    async fn reset(&self) {
        *self.open.lock().await = None;
    }

    pub(crate) async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        m: &Publication,
    ) -> Result<(), PublishError> {
        let publisher = self.publisher().await?;
        let mut headers = FieldTable::default();
        for (name, value) in &m.headers {
            let value = AMQPValue::LongString(LongString::from(value.clone()));
            headers.insert(name.as_str().into(), value);
        }
        let out = amqp::Outgoing {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            payload: m.body.clone(),
            properties: BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(PERSISTENT)
                // The request's own, as the consumer forwards it.
                .with_content_type(
                    m.content_type
                        .as_deref()
                        .unwrap_or("application/json")
                        .into(),
                ),
        };
        let published = publisher.publish(&out).await;
        if let Err(amqp::PublishError::Channel { .. }) = &published {
            self.reset().await;
        }
        Ok(published?)
    }
}
