//! The reply record of an outcome, fresh or stored: a requester whose
//! first reply was lost gets the same result from a duplicate.

use super::outbox::Record;
use crate::engine::{Decision, Incoming};
use crate::store::StoredResult;
use serde_json::json;

/// Headers dedupq adds to a reply (the request's headers follow, so
/// correlation ids travel back).
pub mod header {
    pub const OUTCOME: &str = "dedupq-outcome";
    pub const TENANT: &str = "dedupq-tenant";
    pub const KEY: &str = "dedupq-key";
}

/// None for a decision without an identity (only invalid messages, which
/// are dead-lettered, have none).
pub fn record(
    topic: &str,
    decision: &Decision,
    result: &StoredResult,
    request: &Incoming,
) -> Option<Record> {
    let id = decision.identity.as_ref()?;
    let payload = json!({
        "tenant": id.tenant.as_str(),
        "key": id.key.as_str(),
        "outcome": decision.outcome.label(),
        "status": result.status,
        "result_status": result.result_status,
        "body": result.body,
    });
    let mut headers: Vec<(String, Vec<u8>)> = vec![
        (header::OUTCOME.into(), decision.outcome.label().into()),
        (header::TENANT.into(), id.tenant.as_str().into()),
        (header::KEY.into(), id.key.as_str().into()),
    ];
    headers.extend(request.headers.iter().cloned());
    Some(Record {
        topic: topic.to_string(),
        key: Some(id.key.as_str().as_bytes().to_vec()),
        payload: payload.to_string().into_bytes(),
        headers,
    })
}
