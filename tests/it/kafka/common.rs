//! Small helpers shared by the Kafka tests.

use dedupq::engine::Engine;
use std::collections::BTreeSet;

pub const TENANT: &str = "t1";

pub fn body(n: usize) -> Vec<u8> {
    format!(
        r#"{{"amount":{},"currency":"EUR","recipient":"r-{n}"}}"#,
        100 + n
    )
    .into_bytes()
}

/// Produces the payments `k{n}` for every `n` in `keys` to partition 0 of
/// `topic`, one after another, each with [`body`]`(n)`.
pub async fn produce_payments(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    keys: std::ops::Range<usize>,
) {
    for k in keys {
        crate::support::kafka::produce(
            producer,
            topic,
            0,
            &crate::support::kafka::headers(TENANT, &format!("k{k}")),
            &body(k),
        )
        .await;
    }
}

/// Final decisions of one outcome label counted by an engine.
pub fn outcomes(engine: &Engine, outcome: &str) -> u64 {
    engine
        .metrics()
        .messages
        .with_label_values(&["kafka", outcome])
        .get()
}

/// Distinct derived keys among handler calls, and the number of calls.
pub fn effects(calls: &[crate::support::handlers::Call]) -> (usize, usize) {
    let keys: BTreeSet<&str> = calls.iter().map(|c| c.derived_key.as_str()).collect();
    (keys.len(), calls.len())
}

/// The value of the first header called `name` in a raw record.
pub fn raw_header<'a>(r: &'a crate::support::kafka_raw::RawRecord, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| n.as_slice() == name.as_bytes())
        .and_then(|(_, v)| v.as_deref())
}

pub fn raw_header_str(r: &crate::support::kafka_raw::RawRecord, name: &str) -> String {
    String::from_utf8_lossy(raw_header(r, name).unwrap_or_default()).into_owned()
}
