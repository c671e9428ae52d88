//! A delivery as every transport hands it over: headers, raw payload and
//! where it came from. A leaf module: the engine, the handlers and the
//! transports all use it, and it uses none of them.

use chrono::{DateTime, Utc};
use std::fmt;

/// Where a delivery came from; carried into logs and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Kafka record.
    Kafka {
        /// The topic it was read from.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset: committed only once its outcome is durable.
        offset: i64,
    },
    /// A RabbitMQ delivery.
    Amqp {
        /// The queue it was consumed from.
        queue: String,
        /// The channel's tag for it, which acks it once its outcome is
        /// durable.
        delivery_tag: u64,
    },
    /// A request to the HTTP API: the route's name and a per-process
    /// request number.
    Http {
        /// The route's name.
        route: String,
        /// Numbers the requests of this process.
        request_id: u64,
    },
    /// Messages fed to the engine directly (library use, tests).
    Direct {
        /// The caller's number for it.
        id: u64,
    },
}

impl Source {
    /// The way this delivery came in.
    pub fn transport(&self) -> Transport {
        match self {
            Source::Kafka { .. } => Transport::Kafka,
            Source::Amqp { .. } => Transport::Amqp,
            Source::Http { .. } => Transport::Http,
            Source::Direct { .. } => Transport::Direct,
        }
    }
}

/// The way a delivery came in: the `transport` label of metrics and spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A Kafka consumer.
    Kafka,
    /// A RabbitMQ consumer.
    Amqp,
    /// The HTTP API.
    Http,
    /// Fed to the engine directly (library use, tests).
    Direct,
}

impl Transport {
    /// The brokers, whose series of `dedupq_replies_failed_total` and
    /// `dedupq_stalled_lanes` exist from start-up.
    pub const BROKERS: [Transport; 2] = [Transport::Kafka, Transport::Amqp];

    /// The `transport` label value: `kafka`, `amqp`, `http` or `direct`.
    pub fn label(self) -> &'static str {
        match self {
            Transport::Kafka => "kafka",
            Transport::Amqp => "amqp",
            Transport::Http => "http",
            Transport::Direct => "direct",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Kafka {
                topic,
                partition,
                offset,
            } => write!(f, "kafka:{topic}/{partition}@{offset}"),
            Source::Amqp {
                queue,
                delivery_tag,
            } => write!(f, "amqp:{queue}#{delivery_tag}"),
            Source::Http { route, request_id } => write!(f, "http:{route}#{request_id}"),
            Source::Direct { id } => write!(f, "direct:{id}"),
        }
    }
}

/// One header as the broker delivered it: name and value are untrusted
/// bytes (a name need not be UTF-8; a Kafka value may be null).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The name's bytes as delivered.
    pub name: Vec<u8>,
    /// The value's bytes; None for a Kafka header whose value is null.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// A header with a (non-null) value.
    pub fn new(name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: Some(value.into()),
        }
    }

    /// Header names compare ASCII-case-insensitively, byte for byte.
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name.as_bytes())
    }

    /// The name as text, if it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.name).ok()
    }
}

/// One delivery: headers, the raw payload and its coordinates.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// Every header in delivery order, repeats included: a repeated
    /// identity header is refused, not resolved by position.
    pub headers: Vec<Header>,
    /// The payload byte for byte: what is fingerprinted and what a handler
    /// forwards.
    pub body: Vec<u8>,
    /// The payload's media type where the transport carries one (AMQP's
    /// `content_type` property, a Kafka `content-type` header); forwarded
    /// with the payload.
    pub content_type: Option<String>,
    /// Where it came from.
    pub source: Source,
    /// When this process received it: waits and latencies count from here.
    pub received_at: DateTime<Utc>,
    /// How often this message already came back to be retried (delay-queue
    /// trips, in-place retries).
    pub retries: u32,
    /// The transport's limit on `retries`: a message that would come back
    /// once more is dead-lettered instead (`retry_limit`). None: no limit
    /// (Kafka, whose in-place waits end with the lease or the attempts).
    pub retry_limit: Option<u32>,
}

impl Incoming {
    /// A delivery with no headers, received now, not yet retried.
    pub fn new(source: Source, body: impl Into<Vec<u8>>) -> Self {
        Self {
            headers: Vec::new(),
            body: body.into(),
            content_type: None,
            source,
            received_at: Utc::now(),
            retries: 0,
            retry_limit: None,
        }
    }

    /// Adds a header after the others.
    pub fn with_header(mut self, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push(Header::new(name, value));
        self
    }

    /// Sets the payload's media type.
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The first header called `name` (null values read as empty).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.is(name))
            .map(|h| h.value.as_deref().unwrap_or_default())
    }

    /// How many headers are called `name`.
    pub fn count_headers(&self, name: &str) -> usize {
        self.headers.iter().filter(|h| h.is(name)).count()
    }
}
