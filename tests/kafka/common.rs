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
