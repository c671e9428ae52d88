//! A minimal AMQP 0-9-1 client that treats every string as bytes, for what
//! lapin cannot handle: properties (`message_id`, `reply_to`, …) and header
//! names that are not UTF-8. lapin (through amq-protocol) refuses to build
//! them and fails its whole connection when it receives one; RabbitMQ
//! stores and delivers them as they are. `dedupq dlq` reads and replays the
//! dead-letter queue with it, the chaos run publishes such poison with it,
//! and the tests read queues byte for byte with it.
//!
//! It speaks just enough: PLAIN login over `amqp://` or `amqps://` (the
//! same CA handling as lapin's connect), one channel in confirm mode,
//! `basic.publish` (mandatory, waiting for the broker's confirm),
//! `basic.get` returning every property as bytes, `basic.ack`, and a
//! passive `queue.declare` for a queue's depth. Connecting is bounded by
//! `amqp.connect_timeout`, every later exchange by [`ANSWER_WITHIN`].

mod codec;
mod error;
mod get;
mod properties;
mod stream;

pub use codec::{FieldValue, Table};
pub use error::RawAmqpError;
pub use get::RawDelivery;
pub use properties::RawProperties;

use crate::config::AmqpSettings;
use codec::{frame, method, Reader, Writer, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT};
use codec::{FRAME_END, FRAME_METHOD};
use lapin::uri::AMQPUri;
use std::future::Future;
use std::time::Duration;
use stream::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHANNEL: u16 = 1;
/// Every exchange with the broker after connecting is bounded by this.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// Room for a frame's type, channel, size and end octet.
const FRAME_OVERHEAD: usize = 8;

/// One connection with one channel in confirm mode.
pub struct RawAmqp {
    stream: Stream,
    frame_max: u32,
    published: u64,
}

async fn bounded<T>(
    work: impl Future<Output = Result<T, RawAmqpError>>,
) -> Result<T, RawAmqpError> {
    tokio::time::timeout(ANSWER_WITHIN, work)
        .await
        .unwrap_or(Err(RawAmqpError::Timeout(ANSWER_WITHIN)))
}

/// Connects, publishes one message to the default exchange with routing key
/// `queue`, waits for the broker's confirm and closes.
pub async fn publish_raw(
    settings: &AmqpSettings,
    queue: &str,
    properties: &RawProperties,
    body: &[u8],
) -> Result<(), RawAmqpError> {
    let mut client = RawAmqp::connect(settings, "dedupq-raw").await?;
    client.publish("", queue, properties, body).await?;
    client.close().await
}

impl RawAmqp {
    /// Connects to `amqp.url` as `name` (shown in the management UI) and
    /// opens the channel; TCP, TLS and AMQP handshakes together are bounded
    /// by `amqp.connect_timeout`.
    pub async fn connect(settings: &AmqpSettings, name: &str) -> Result<Self, RawAmqpError> {
        let uri = super::connect::uri(settings)?;
        let after = settings.connect_timeout;
        let opened = tokio::time::timeout(after, async {
            let mut me = Self {
                stream: Stream::open(&uri, settings).await?,
                frame_max: 4096,
                published: 0,
            };
            me.handshake(&uri, name).await?;
            Ok(me)
        });
        opened.await.unwrap_or_else(|_| {
            Err(RawAmqpError::ConnectTimeout {
                url: settings.url.to_string(),
                after,
            })
        })
    }

    async fn handshake(&mut self, uri: &AMQPUri, name: &str) -> Result<(), RawAmqpError> {
        self.write(b"AMQP\x00\x00\x09\x01").await?;
        let start = self.expect(0, (10, 10)).await?;
        let mut r = Reader(&start);
        r.take(2)?;
        r.table()?;
        if !r.long_str()?.split(|b| *b == b' ').any(|m| m == b"PLAIN") {
            return Err(RawAmqpError::Protocol(
                "the broker does not offer PLAIN".into(),
            ));
        }
        let user = &uri.authority.userinfo;
        let login = [
            b"\0",
            user.username.as_bytes(),
            b"\0",
            user.password.as_bytes(),
        ]
        .concat();
        let client_properties = vec![
            (
                b"product".to_vec(),
                FieldValue::LongStr(b"dedupq raw AMQP client".to_vec()),
            ),
            (
                b"connection_name".to_vec(),
                FieldValue::LongStr(name.as_bytes().to_vec()),
            ),
        ];
        let mut start_ok = method(10, 11);
        start_ok.table(&client_properties)?.short_str(b"PLAIN")?;
        start_ok.long_str(&login).short_str(b"en_US")?;
        self.send(0, start_ok).await?;

        let tune = self.expect(0, (10, 30)).await?;
        let mut r = Reader(&tune);
        r.u16()?;
        let frame_max = r.u32()?;
        self.frame_max = if frame_max == 0 { 131_072 } else { frame_max };
        let mut tune_ok = method(10, 31);
        // One channel; no heartbeats: nothing runs in the background to
        // send them, and every exchange is bounded by ANSWER_WITHIN, which
        // notices a dead peer instead.
        tune_ok.u16(1).u32(self.frame_max).u16(0);
        self.send(0, tune_ok).await?;
        let mut open = method(10, 40);
        open.short_str(uri.vhost.as_bytes())?.short_str(b"")?.u8(0);
        self.send(0, open).await?;
        self.expect(0, (10, 41)).await?;

        let mut channel_open = method(20, 10);
        channel_open.short_str(b"")?;
        self.send(CHANNEL, channel_open).await?;
        self.expect(CHANNEL, (20, 11)).await?;
        let mut confirm = method(85, 10);
        confirm.u8(0);
        self.send(CHANNEL, confirm).await?;
        self.expect(CHANNEL, (85, 11)).await?;
        Ok(())
    }

    /// Publishes with `mandatory` set and waits for the broker's confirm:
    /// an unroutable or refused message is an error, not a silent drop.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        properties: &RawProperties,
        body: &[u8],
    ) -> Result<(), RawAmqpError> {
        let mut publish = method(60, 40);
        publish
            .u16(0)
            .short_str(exchange.as_bytes())?
            .short_str(routing_key.as_bytes())?
            .u8(1);
        let mut header = Writer::default();
        header.u16(60).u16(0).u64(body.len() as u64);
        properties.encode(&mut header)?;
        let max = self.frame_max as usize - FRAME_OVERHEAD;
        if header.0.len() > max {
            return Err(RawAmqpError::HeaderTooLarge(header.0.len(), self.frame_max));
        }
        let mut out = frame(FRAME_METHOD, CHANNEL, &publish.0);
        out.extend(frame(FRAME_HEADER, CHANNEL, &header.0));
        for chunk in body.chunks(max) {
            out.extend(frame(FRAME_BODY, CHANNEL, chunk));
        }
        bounded(async {
            self.write(&out).await?;
            self.published += 1;
            self.await_confirm().await
        })
        .await
    }

    async fn await_confirm(&mut self) -> Result<(), RawAmqpError> {
        let mut returned = None;
        loop {
            let (_, ids, args) = self.next_method().await?;
            let mut r = Reader(&args);
            match ids {
                (60, 50) => {
                    let code = r.u16()?;
                    let text = String::from_utf8_lossy(&r.short_str()?).into_owned();
                    self.read_content().await?;
                    returned = Some(RawAmqpError::Unroutable { code, text });
                }
                (60, 80) | (60, 120) => {
                    let tag = r.u64()?;
                    let multiple = r.u8()? & 1 == 1;
                    if tag == self.published || (multiple && tag >= self.published) {
                        return match (ids.1, returned) {
                            (120, _) => Err(RawAmqpError::Nacked),
                            (_, Some(e)) => Err(e),
                            _ => Ok(()),
                        };
                    }
                }
                other => {
                    return Err(RawAmqpError::Protocol(format!(
                        "unexpected method {other:?} while waiting for a confirm"
                    )))
                }
            }
        }
    }

    /// Closes the connection and waits for the broker's close-ok; every
    /// delivery taken and not acked goes back to its queue.
    pub async fn close(mut self) -> Result<(), RawAmqpError> {
        let mut close = method(10, 50);
        close.u16(200).short_str(b"done")?.u16(0).u16(0);
        bounded(async {
            self.send(0, close).await?;
            self.expect(0, (10, 51)).await.map(drop)
        })
        .await
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), RawAmqpError> {
        self.stream.write_all(bytes).await?;
        // TLS may hold the last record until flushed.
        self.stream.flush().await?;
        Ok(())
    }

    async fn send(&mut self, channel: u16, payload: Writer) -> Result<(), RawAmqpError> {
        self.write(&frame(FRAME_METHOD, channel, &payload.0)).await
    }

    async fn read_frame(&mut self) -> Result<(u8, u16, Vec<u8>), RawAmqpError> {
        let mut head = [0u8; 7];
        self.stream.read_exact(&mut head).await?;
        let mut r = Reader(&head);
        let (kind, channel, size) = (r.u8()?, r.u16()?, r.u32()?);
        let mut payload = vec![0u8; size as usize + 1];
        self.stream.read_exact(&mut payload).await?;
        if payload.pop() != Some(FRAME_END) {
            return Err(RawAmqpError::Protocol(
                "a frame without its end octet".into(),
            ));
        }
        Ok((kind, channel, payload))
    }

    /// The next method frame, skipping heartbeats; a close from the broker
    /// is answered and returned as an error.
    async fn next_method(&mut self) -> Result<(u16, (u16, u16), Vec<u8>), RawAmqpError> {
        loop {
            let (kind, channel, payload) = self.read_frame().await?;
            match kind {
                FRAME_HEARTBEAT => continue,
                FRAME_METHOD => {}
                other => {
                    return Err(RawAmqpError::Protocol(format!(
                        "unexpected frame type {other}"
                    )))
                }
            }
            let mut r = Reader(&payload);
            let ids = (r.u16()?, r.u16()?);
            let scope = match ids {
                (10, 50) => "connection",
                (20, 40) => "channel",
                _ => return Ok((channel, ids, r.0.to_vec())),
            };
            let code = r.u16()?;
            let text = String::from_utf8_lossy(&r.short_str()?).into_owned();
            self.send(channel, method(ids.0, ids.1 + 1)).await?;
            return Err(RawAmqpError::Closed { scope, code, text });
        }
    }

    async fn expect(&mut self, channel: u16, want: (u16, u16)) -> Result<Vec<u8>, RawAmqpError> {
        let (ch, ids, args) = self.next_method().await?;
        if (ch, ids) != (channel, want) {
            return Err(RawAmqpError::Protocol(format!(
                "expected method {want:?} on channel {channel}, got {ids:?} on channel {ch}"
            )));
        }
        Ok(args)
    }
}
