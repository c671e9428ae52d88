//! The reply record of an outcome, fresh or stored: a requester whose
//! first reply was lost gets the same result from a duplicate.

use super::outbox::Record;
use crate::engine::{Decision, Header, Incoming};
use crate::store::StoredResult;
use crate::transport::envelope;

/// None for a decision without an identity (only invalid messages, which
/// are dead-lettered, have none). The request's headers follow dedupq's,
/// so correlation ids travel back.
pub(super) fn record(
    topic: &str,
    decision: &Decision,
    result: &StoredResult,
    request: &Incoming,
) -> Option<Record> {
    let id = decision.identity.as_ref()?;
    let headers = envelope::reply_headers(decision, result)
        .into_iter()
        .map(|(n, v)| Header::new(n, v))
        .chain(request.headers.iter().cloned())
        .collect();
    Some(Record {
        topic: topic.to_string(),
        key: Some(id.key.as_str().as_bytes().to_vec()),
        payload: envelope::reply_payload(decision, result),
        headers,
    })
}
