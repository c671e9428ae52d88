//! `basic.get`, reading every property of a message as bytes.

use super::codec::{method, Reader, FRAME_BODY, FRAME_HEADER};
use super::{bounded, RawAmqp, RawAmqpError, RawProperties, CHANNEL};

/// A message taken with `basic.get`.
#[derive(Debug, Clone, PartialEq)]
pub struct RawDelivery {
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub exchange: Vec<u8>,
    pub routing_key: Vec<u8>,
    pub properties: RawProperties,
    pub body: Vec<u8>,
}

impl RawAmqp {
    /// Takes the message at the head of `queue` (acknowledged on receipt),
    /// every property as bytes; `None` when the queue is empty.
    pub async fn get(&mut self, queue: &str) -> Result<Option<RawDelivery>, RawAmqpError> {
        self.basic_get(queue, true).await
    }

    /// Like `get`, but the delivery stays unacknowledged: it goes back to
    /// the queue when this connection ends (closed or dropped).
    pub async fn get_unacked(&mut self, queue: &str) -> Result<Option<RawDelivery>, RawAmqpError> {
        self.basic_get(queue, false).await
    }

    async fn basic_get(
        &mut self,
        queue: &str,
        no_ack: bool,
    ) -> Result<Option<RawDelivery>, RawAmqpError> {
        let mut get = method(60, 70);
        get.u16(0).short_str(queue.as_bytes())?.u8(u8::from(no_ack));
        bounded(async {
            self.send(CHANNEL, get).await?;
            let (_, ids, args) = self.next_method().await?;
            match ids {
                (60, 72) => Ok(None),
                (60, 71) => {
                    let mut r = Reader(&args);
                    let delivery_tag = r.u64()?;
                    let redelivered = r.u8()? & 1 == 1;
                    let exchange = r.short_str()?;
                    let routing_key = r.short_str()?;
                    let (properties, body) = self.read_content().await?;
                    Ok(Some(RawDelivery {
                        delivery_tag,
                        redelivered,
                        exchange,
                        routing_key,
                        properties,
                        body,
                    }))
                }
                other => Err(RawAmqpError::Protocol(format!(
                    "unexpected method {other:?} after basic.get"
                ))),
            }
        })
        .await
    }

    /// A content header frame and the body frames it announces.
    pub(super) async fn read_content(&mut self) -> Result<(RawProperties, Vec<u8>), RawAmqpError> {
        let (kind, _, header) = self.read_frame().await?;
        if kind != FRAME_HEADER {
            return Err(RawAmqpError::Protocol(format!(
                "expected a content header, got frame type {kind}"
            )));
        }
        let mut r = Reader(&header);
        r.take(4)?;
        let size = r.u64()? as usize;
        let properties = RawProperties::decode(&mut r)?;
        let mut body = Vec::with_capacity(size);
        while body.len() < size {
            match self.read_frame().await? {
                (FRAME_BODY, _, chunk) => body.extend_from_slice(&chunk),
                (kind, _, _) => {
                    return Err(RawAmqpError::Protocol(format!(
                        "expected a body frame, got type {kind}"
                    )))
                }
            }
        }
        Ok((properties, body))
    }
}
