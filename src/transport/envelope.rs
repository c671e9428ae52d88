//! What dedupq writes on every transport, built in one place: the reply
//! envelope, the headers of replies and dead letters, and the rule that
//! makes a dead letter fit the broker's size limit. Transports only encode
//! these into their own header types.

use crate::engine::{DeadLetterReason, Decision};
use crate::store::StoredResult;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::value::RawValue;

/// Every header name dedupq writes, on both transports.
pub mod header {
    /// Dead letters: the low-cardinality reason label (`conflict`,
    /// `exhausted_retries`, …).
    pub const REASON: &str = "dedupq-reason";
    /// Dead letters: what happened, for a person (at most 1 KiB).
    pub const DETAIL: &str = "dedupq-detail";
    /// The outcome label (`processed`, `duplicate`, `conflict`, …).
    pub const OUTCOME: &str = "dedupq-outcome";
    /// The message's tenant, when it was parsed that far.
    pub const TENANT: &str = "dedupq-tenant";
    /// The message's idempotency key, when it was parsed that far.
    pub const KEY: &str = "dedupq-key";
    /// `v<version>:<hex>`.
    pub const FINGERPRINT: &str = "dedupq-fingerprint";
    /// RFC 3339 time dedupq first received the message.
    pub const FIRST_SEEN: &str = "dedupq-first-seen";
    /// Kafka dead letters: the topic the message came from.
    pub const SOURCE_TOPIC: &str = "dedupq-source-topic";
    /// Kafka dead letters: its partition.
    pub const SOURCE_PARTITION: &str = "dedupq-source-partition";
    /// Kafka dead letters: its offset.
    pub const SOURCE_OFFSET: &str = "dedupq-source-offset";
    /// RabbitMQ dead letters: the queue the message came from.
    pub const SOURCE_QUEUE: &str = "dedupq-source-queue";
    /// RabbitMQ dead letters: the delivery tag it had on its channel.
    pub const DELIVERY_TAG: &str = "dedupq-delivery-tag";
    /// Trips through the delay queue so far (RabbitMQ).
    pub const TRIPS: &str = "dedupq-trips";
    /// The producer's `user_id` property, which the broker would refuse on
    /// a republish under dedupq's own user (RabbitMQ).
    pub const USER_ID: &str = "dedupq-user-id";
    /// A dead letter whose payload did not fit: its length in bytes; the
    /// payload is left out (find it at the source coordinates).
    pub const PAYLOAD_OMITTED: &str = "dedupq-payload-omitted";
    /// The left-out payload's SHA-256, in hex.
    pub const PAYLOAD_SHA256: &str = "dedupq-payload-sha256";
    /// A dead letter whose original headers did not fit: how many were
    /// left out.
    pub const HEADERS_OMITTED: &str = "dedupq-headers-omitted";
    /// Replies: the key's status (`done`, `failed`, `unknown`).
    pub const STATUS: &str = "dedupq-status";
    /// Replies: the status code of the stored result.
    pub const RESULT_STATUS: &str = "dedupq-result-status";

    /// Every name above: diagnostic headers a replay strips again.
    pub const ALL: [&str; 19] = [
        REASON,
        DETAIL,
        OUTCOME,
        TENANT,
        KEY,
        FINGERPRINT,
        FIRST_SEEN,
        SOURCE_TOPIC,
        SOURCE_PARTITION,
        SOURCE_OFFSET,
        SOURCE_QUEUE,
        DELIVERY_TAG,
        TRIPS,
        USER_ID,
        PAYLOAD_OMITTED,
        PAYLOAD_SHA256,
        HEADERS_OMITTED,
        STATUS,
        RESULT_STATUS,
    ];
}

/// Longest `dedupq-detail` kept.
const MAX_DETAIL: usize = 1024;

/// Where a message came from, for its dead letter.
pub(crate) enum Origin<'a> {
    /// A Kafka record.
    Kafka {
        /// The source topic.
        topic: &'a str,
        /// The record's partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
    },
    /// A RabbitMQ delivery.
    Amqp {
        /// The queue it was consumed from.
        queue: &'a str,
        /// Its delivery tag on the consuming channel.
        delivery_tag: u64,
        /// Trips through the delay queue so far.
        trips: u32,
    },
}

/// dedupq's own headers as name and text value, before a transport encodes
/// them.
pub(crate) type Headers = Vec<(&'static str, String)>;

/// Headers that say who a decision is about.
fn identity_headers(decision: &Decision, out: &mut Headers) {
    out.push((header::OUTCOME, decision.outcome.label().into()));
    if let Some(id) = &decision.identity {
        out.push((header::TENANT, id.tenant.as_str().into()));
        out.push((header::KEY, id.key.as_str().into()));
    }
}

/// The headers of a dead letter: why, what, and where it came from.
pub(crate) fn dead_letter_headers(
    decision: &Decision,
    reason: &DeadLetterReason,
    detail: &str,
    origin: &Origin<'_>,
    first_seen: DateTime<Utc>,
) -> Headers {
    let mut h = vec![
        (header::REASON, reason.label().to_string()),
        (header::DETAIL, truncate(detail, MAX_DETAIL).to_string()),
    ];
    identity_headers(decision, &mut h);
    if let Some(fp) = &decision.fingerprint {
        h.push((header::FINGERPRINT, fp.to_string()));
    }
    match origin {
        Origin::Kafka {
            topic,
            partition,
            offset,
        } => {
            h.push((header::SOURCE_TOPIC, topic.to_string()));
            h.push((header::SOURCE_PARTITION, partition.to_string()));
            h.push((header::SOURCE_OFFSET, offset.to_string()));
        }
        Origin::Amqp {
            queue,
            delivery_tag,
            trips,
        } => {
            h.push((header::SOURCE_QUEUE, queue.to_string()));
            h.push((header::DELIVERY_TAG, delivery_tag.to_string()));
            h.push((header::TRIPS, trips.to_string()));
        }
    }
    h.push((header::FIRST_SEEN, rfc3339(first_seen)));
    h
}

/// The headers of a reply.
pub(crate) fn reply_headers(decision: &Decision, result: &StoredResult) -> Headers {
    let mut h = Vec::with_capacity(5);
    identity_headers(decision, &mut h);
    h.push((header::STATUS, result.status.as_str().into()));
    h.push((header::RESULT_STATUS, result.result_status.to_string()));
    h
}

#[derive(Serialize)]
struct Envelope<'a> {
    tenant: &'a str,
    key: &'a str,
    outcome: &'static str,
    status: &'static str,
    result_status: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<&'a str>,
    /// The stored answer verbatim when it is JSON (numbers as the provider
    /// wrote them); null when there is none.
    body: Option<&'a RawValue>,
    /// The stored answer in base64 when it is not JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// The reply payload, the same JSON on every transport:
/// `{"tenant", "key", "outcome", "status", "result_status", "content_type",
/// "body"}` with the stored answer verbatim in `body` when it is JSON, and
/// in `body_base64` otherwise.
pub(crate) fn reply_payload(decision: &Decision, result: &StoredResult) -> Vec<u8> {
    let (tenant, key) = decision
        .identity
        .as_ref()
        .map(|i| (i.tenant.as_str(), i.key.as_str()))
        .unwrap_or_default();
    let raw = std::str::from_utf8(&result.body)
        .ok()
        .filter(|_| crate::json::parse(&result.body).is_ok())
        .and_then(|text| serde_json::from_str::<&RawValue>(text).ok());
    let body_base64 = (raw.is_none() && !result.body.is_empty()).then(|| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&result.body)
    });
    let envelope = Envelope {
        tenant,
        key,
        outcome: decision.outcome.label(),
        status: result.status.as_str(),
        result_status: result.result_status,
        content_type: result.content_type.as_deref(),
        body: raw,
        body_base64,
    };
    serde_json::to_vec(&envelope).expect("the envelope serializes")
}

/// A payload and headers cut to fit `max` bytes: the payload is left out
/// past the limit (its length and SHA-256 recorded instead), and then the
/// original headers, last first. dedupq's own headers always stay.
pub(crate) struct Fitted<H> {
    /// The payload, or nothing when it did not fit.
    pub payload: Vec<u8>,
    /// The original headers kept, in their order.
    pub original_headers: Vec<H>,
    /// Headers saying what was left out (`dedupq-payload-omitted`,
    /// `dedupq-payload-sha256`, `dedupq-headers-omitted`); empty when
    /// everything fit.
    pub extra: Headers,
}

/// Fits a dead letter into `max` bytes (see [`Fitted`]). `own` are
/// dedupq's headers, counted but never cut; `size_of` is what one
/// original header costs on the transport.
pub(crate) fn fit<H>(
    payload: &[u8],
    own: &Headers,
    original: &[H],
    size_of: impl Fn(&H) -> usize,
    max: usize,
) -> Fitted<H>
where
    H: Clone,
{
    let own_size: usize = own.iter().map(|(n, v)| n.len() + v.len()).sum();
    let originals: usize = original.iter().map(&size_of).sum();
    let mut extra = Vec::new();
    let mut kept_payload = payload.to_vec();
    if own_size + originals + payload.len() > max {
        use sha2::{Digest, Sha256};
        extra.push((header::PAYLOAD_OMITTED, payload.len().to_string()));
        extra.push((
            header::PAYLOAD_SHA256,
            crate::fingerprint::hex(&Sha256::digest(payload)),
        ));
        kept_payload.clear();
    }
    let room = max.saturating_sub(own_size + 128 + kept_payload.len());
    let mut kept = Vec::with_capacity(original.len());
    let mut used = 0;
    for h in original {
        let size = size_of(h);
        if used + size > room {
            break;
        }
        used += size;
        kept.push(h.clone());
    }
    if kept.len() < original.len() {
        extra.push((
            header::HEADERS_OMITTED,
            (original.len() - kept.len()).to_string(),
        ));
    }
    Fitted {
        payload: kept_payload,
        original_headers: kept,
        extra,
    }
}

/// A time as dedupq writes it in headers: RFC 3339, UTC, milliseconds.
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Action, Outcome};
    use crate::store::KeyStatus;

    fn decision() -> Decision {
        Decision {
            outcome: Outcome::Duplicate,
            action: Action::Commit { reply: None },
            identity: None,
            fingerprint: None,
            epoch: None,
        }
    }

    fn result(body: &[u8]) -> StoredResult {
        StoredResult {
            status: KeyStatus::Done,
            result_status: 200,
            body: body.to_vec(),
            content_type: Some("application/json".into()),
        }
    }

    #[test]
    fn a_json_answer_travels_verbatim_and_bytes_in_base64() {
        let exact =
            br#"{"amount":10.000000000000001,"big":18446744073709551617,"z":-0,"a":"\u0000"}"#;
        let out = String::from_utf8(reply_payload(&decision(), &result(exact))).unwrap();
        assert!(out.contains(r#""body":{"amount":10.000000000000001,"big":18446744073709551617,"z":-0,"a":"\u0000"}"#), "{out}");
        let out = String::from_utf8(reply_payload(&decision(), &result(b"\x00\xffok"))).unwrap();
        assert!(
            out.contains(r#""body":null"#) && out.contains(r#""body_base64":"AP9vaw==""#),
            "{out}"
        );
    }

    #[test]
    fn a_dead_letter_past_the_limit_leaves_its_payload_out_and_says_so() {
        let own: Headers = vec![(header::REASON, "too_large".into())];
        let originals = vec![(b"a".to_vec(), b"1".to_vec()); 3];
        let size = |h: &(Vec<u8>, Vec<u8>)| h.0.len() + h.1.len();
        let small = fit(&[7u8; 100], &own, &originals, size, 1000);
        assert_eq!(small.payload.len(), 100);
        assert!(small.extra.is_empty());
        let big = fit(&[7u8; 2000], &own, &originals, size, 1000);
        assert!(big.payload.is_empty());
        assert_eq!(big.original_headers.len(), 3);
        assert!(big
            .extra
            .contains(&(header::PAYLOAD_OMITTED, "2000".into())));
        let crowded = vec![(b"h".to_vec(), vec![0u8; 400]); 5];
        let cut = fit(&[7u8; 10], &own, &crowded, size, 1000);
        assert!(cut.original_headers.len() < 5);
        assert!(cut.extra.contains(&(
            header::HEADERS_OMITTED,
            (5 - cut.original_headers.len()).to_string()
        )));
    }
}
