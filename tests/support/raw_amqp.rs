//! The raw AMQP 0-9-1 client of `dedupq::broker::amqp::raw` for the tests:
//! messages no client library will send (header-table keys, header strings
//! and short-string properties that are arbitrary bytes), and queues read
//! back with every property as bytes.

// Not every test binary that includes the support module uses them all.
#[allow(unused_imports)]
pub use dedupq::broker::amqp::raw::{
    FieldValue, RawAmqp, RawAmqpError, RawDelivery, RawProperties, Table,
};
use dedupq::config::AmqpSettings;

/// Connects to `url` (one channel in confirm mode).
pub async fn connect(url: &str) -> Result<RawAmqp, RawAmqpError> {
    RawAmqp::connect(&AmqpSettings::at(url), "dedupq-test-raw").await
}

/// Connects to `url`, publishes one message to the default exchange with
/// routing key `queue`, waits for the broker's ack and closes.
pub async fn publish_raw(
    url: &str,
    queue: &str,
    properties: &RawProperties,
    body: &[u8],
) -> Result<(), RawAmqpError> {
    dedupq::broker::amqp::raw::publish_raw(&AmqpSettings::at(url), queue, properties, body).await
}

/// Takes (acks) every message now in `queue`, every property as bytes.
pub async fn take_all(queue: &str) -> Vec<RawDelivery> {
    let mut raw = connect(&super::amqp::amqp_url())
        .await
        .expect("raw connect");
    let mut out = Vec::new();
    while let Some(d) = raw.get(queue).await.expect("basic.get") {
        out.push(d);
    }
    raw.close().await.expect("raw close");
    out
}

/// The reason of the first `x-death` entry of a dead letter.
pub fn death_reason(properties: &RawProperties) -> Option<Vec<u8>> {
    let Some(FieldValue::Array(deaths)) = properties.header(b"x-death") else {
        return None;
    };
    let Some(FieldValue::Table(first)) = deaths.first() else {
        return None;
    };
    first.iter().find_map(|(k, v)| match (k.as_slice(), v) {
        (b"reason", FieldValue::LongStr(r)) => Some(r.clone()),
        _ => None,
    })
}
