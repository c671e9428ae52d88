//! A delivery as every transport hands it over: headers, raw payload and
//! where it came from. A leaf module: the engine, the handlers and the
//! transports all use it, and it uses none of them.

use chrono::{DateTime, Utc};
use std::fmt;

/// Where a delivery came from; carried into logs and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Kafka {
        topic: String,
        partition: i32,
        offset: i64,
    },
    Amqp {
        queue: String,
        delivery_tag: u64,
    },
    /// A request to the HTTP API: the route's name and a per-process
    /// request number.
    Http {
        route: String,
        request_id: u64,
    },
    /// Messages fed to the engine directly (library use, tests).
    Direct {
        id: u64,
    },
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

/// One delivery: headers (names compared ASCII-case-insensitively), the raw
/// payload and its coordinates.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub source: Source,
    pub received_at: DateTime<Utc>,
}

impl Incoming {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}
