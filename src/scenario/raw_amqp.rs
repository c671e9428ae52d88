//! Publishing what no AMQP client library will send: header names and a
//! `message_id` that are not UTF-8. lapin refuses to build such a message
//! (and drops its connection when it receives one); RabbitMQ stores and
//! delivers it as it is. Just enough of AMQP 0-9-1 over a plain socket:
//! PLAIN login, one channel in confirm mode, `basic.publish` to the
//! default exchange with `mandatory`, waiting for the broker's ack.

use anyhow::{anyhow, bail, ensure, Context};
use lapin::uri::AMQPUri;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const METHOD: u8 = 1;
const HEADER: u8 = 2;
const BODY: u8 = 3;
const HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CHANNEL: u16 = 1;
const WITHIN: Duration = Duration::from_secs(30);

/// A message with these properties, as raw bytes.
pub struct RawMessage<'a> {
    /// Header names and long-string values.
    pub headers: Vec<(&'a [u8], &'a [u8])>,
    pub message_id: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// Connects, publishes `msg` into `queue`, waits for the confirm, closes.
pub async fn publish(url: &str, queue: &str, msg: &RawMessage<'_>) -> anyhow::Result<()> {
    let uri: AMQPUri = url.parse().map_err(|e| anyhow!("AMQP URL: {e}"))?;
    tokio::time::timeout(WITHIN, async {
        let stream = TcpStream::connect((uri.authority.host.as_str(), uri.authority.port)).await?;
        let mut conn = Raw { stream };
        let frame_max = conn.handshake(&uri).await?;
        conn.publish(queue, msg, frame_max).await?;
        let mut close = method(10, 50);
        close.u16(200).short(b"done")?.u16(0).u16(0);
        conn.send(0, &close).await?;
        conn.expect(0, (10, 51)).await.map(drop)
    })
    .await
    .context("raw AMQP publish timed out")?
}

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn short(&mut self, s: &[u8]) -> anyhow::Result<&mut Self> {
        self.u8(u8::try_from(s.len()).context("a short string past 255 bytes")?);
        self.0.extend_from_slice(s);
        Ok(self)
    }
    fn long(&mut self, s: &[u8]) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s);
        self
    }
    fn table(&mut self, entries: &[(&[u8], &[u8])]) -> anyhow::Result<&mut Self> {
        let mut inner = W::default();
        for (name, value) in entries {
            inner.short(name)?.u8(b'S').long(value);
        }
        Ok(self.long(&inner.0))
    }
}

fn method(class: u16, id: u16) -> W {
    let mut w = W::default();
    w.u16(class).u16(id);
    w
}

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.u8(kind).u16(channel).long(payload).u8(FRAME_END);
    w.0
}

struct Raw {
    stream: TcpStream,
}

impl Raw {
    async fn send(&mut self, channel: u16, w: &W) -> anyhow::Result<()> {
        Ok(self.stream.write_all(&frame(METHOD, channel, &w.0)).await?)
    }

    /// The next method (channel, ids, arguments), skipping heartbeats.
    async fn next_method(&mut self) -> anyhow::Result<(u16, (u16, u16), Vec<u8>)> {
        loop {
            let mut head = [0u8; 7];
            self.stream.read_exact(&mut head).await?;
            let channel = u16::from_be_bytes([head[1], head[2]]);
            let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
            let mut payload = vec![0u8; size + 1];
            self.stream.read_exact(&mut payload).await?;
            ensure!(
                payload.pop() == Some(FRAME_END),
                "a frame without its end octet"
            );
            match head[0] {
                HEARTBEAT => continue,
                METHOD if payload.len() >= 4 => {
                    let ids = (
                        u16::from_be_bytes([payload[0], payload[1]]),
                        u16::from_be_bytes([payload[2], payload[3]]),
                    );
                    if matches!(ids, (10, 50) | (20, 40)) {
                        bail!(
                            "the broker closed the {ids:?} scope: {:?}",
                            String::from_utf8_lossy(&payload[4..])
                        );
                    }
                    return Ok((channel, ids, payload[4..].to_vec()));
                }
                // Content of a returned message: the confirm follows.
                HEADER | BODY => continue,
                other => bail!("unexpected frame type {other}"),
            }
        }
    }

    async fn expect(&mut self, channel: u16, want: (u16, u16)) -> anyhow::Result<Vec<u8>> {
        let (ch, ids, args) = self.next_method().await?;
        ensure!(
            (ch, ids) == (channel, want),
            "expected {want:?} on channel {channel}, got {ids:?} on {ch}"
        );
        Ok(args)
    }

    /// Login, tune, open, a channel in confirm mode; returns frame_max.
    async fn handshake(&mut self, uri: &AMQPUri) -> anyhow::Result<u32> {
        self.stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
        self.expect(0, (10, 10)).await?;
        let user = &uri.authority.userinfo;
        let login = [
            b"\0",
            user.username.as_bytes(),
            b"\0",
            user.password.as_bytes(),
        ]
        .concat();
        let mut start_ok = method(10, 11);
        start_ok
            .table(&[(b"product", b"dedupq scenario")])?
            .short(b"PLAIN")?;
        start_ok.long(&login).short(b"en_US")?;
        self.send(0, &start_ok).await?;
        let tune = self.expect(0, (10, 30)).await?;
        ensure!(tune.len() >= 6, "a short connection.tune");
        let offered = u32::from_be_bytes([tune[2], tune[3], tune[4], tune[5]]);
        let frame_max = if offered == 0 { 131_072 } else { offered };
        let mut tune_ok = method(10, 31);
        tune_ok.u16(1).u32(frame_max).u16(0);
        self.send(0, &tune_ok).await?;
        let mut open = method(10, 40);
        open.short(uri.vhost.as_bytes())?.short(b"")?.u8(0);
        self.send(0, &open).await?;
        self.expect(0, (10, 41)).await?;
        let mut channel = method(20, 10);
        channel.short(b"")?;
        self.send(CHANNEL, &channel).await?;
        self.expect(CHANNEL, (20, 11)).await?;
        let mut confirm = method(85, 10);
        confirm.u8(0);
        self.send(CHANNEL, &confirm).await?;
        self.expect(CHANNEL, (85, 11)).await?;
        Ok(frame_max)
    }

    async fn publish(
        &mut self,
        queue: &str,
        msg: &RawMessage<'_>,
        frame_max: u32,
    ) -> anyhow::Result<()> {
        let mut publish = method(60, 40);
        publish.u16(0).short(b"")?.short(queue.as_bytes())?.u8(1);
        // Property flags: headers, delivery mode, message id.
        let mut flags = (1 << 13) | (1 << 12);
        let mut list = W::default();
        list.table(&msg.headers)?.u8(2);
        if let Some(id) = msg.message_id {
            flags |= 1 << 7;
            list.short(id)?;
        }
        let mut header = W::default();
        header.u16(60).u16(0).u64(msg.body.len() as u64).u16(flags);
        header.0.extend_from_slice(&list.0);
        let max = frame_max as usize - 8;
        ensure!(header.0.len() <= max, "properties larger than a frame");
        let mut out = frame(METHOD, CHANNEL, &publish.0);
        out.extend(frame(HEADER, CHANNEL, &header.0));
        for chunk in msg.body.chunks(max) {
            out.extend(frame(BODY, CHANNEL, chunk));
        }
        self.stream.write_all(&out).await?;
        let mut returned = false;
        loop {
            match self.next_method().await? {
                (_, (60, 50), _) => returned = true,
                (_, (60, 80), _) if !returned => return Ok(()),
                (_, (60, 80), _) => bail!("no queue took the message (basic.return)"),
                (_, (60, 120), _) => bail!("the broker refused the message (basic.nack)"),
                (_, ids, _) => bail!("unexpected method {ids:?} while waiting for a confirm"),
            }
        }
    }
}
