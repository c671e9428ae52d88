//! `basic.get`, reading every property of a message as bytes, and what
//! goes with it: `basic.ack`, and a queue's depth.

use super::codec::{method, Reader, FRAME_BODY, FRAME_HEADER};
use super::{bounded, RawAmqp, RawAmqpError, RawProperties, CHANNEL};

/// A message taken with `basic.get`.
#[derive(Debug, Clone, PartialEq)]
pub struct RawDelivery {
    /// Its tag on this connection's channel, for `ack`.
    pub delivery_tag: u64,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: Vec<u8>,
    /// The routing key it was published with.
    pub routing_key: Vec<u8>,
    /// Every property, as bytes.
    pub properties: RawProperties,
    /// The body, byte for byte.
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

    /// Acknowledges a delivery taken with `get_unacked`: the broker drops
    /// it from its queue. The broker does not answer an ack.
    pub async fn ack(&mut self, delivery_tag: u64) -> Result<(), RawAmqpError> {
        let mut ack = method(60, 80);
        ack.u64(delivery_tag).u8(0);
        bounded(self.send(CHANNEL, ack)).await
    }

    /// Messages ready in `queue` (a passive `queue.declare`). A queue that
    /// does not exist closes the channel (`Closed` with code 404).
    pub async fn message_count(&mut self, queue: &str) -> Result<u32, RawAmqpError> {
        let mut declare = method(50, 10);
        // Flags: passive only; no arguments.
        declare
            .u16(0)
            .short_str(queue.as_bytes())?
            .u8(1)
            .table(&Vec::new())?;
        bounded(async {
            self.send(CHANNEL, declare).await?;
            let ok = self.expect(CHANNEL, (50, 11)).await?;
            let mut r = Reader(&ok);
            r.short_str()?;
            r.u32()
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
