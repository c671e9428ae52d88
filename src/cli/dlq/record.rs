//! One dead letter as an operator sees it, whichever broker holds it, and
//! the filters of `dlq list` and `dlq replay`.

use super::args::DlqArgs;
use crate::cli::output::{cell, Row};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// Headers dedupq adds to a dead letter. Every header with this prefix is
/// diagnostic and is dropped on replay.
pub(super) const DIAGNOSTIC_PREFIX: &str = "dedupq-";
pub(super) const REASON: &str = "dedupq-reason";
pub(super) const DETAIL: &str = "dedupq-detail";
pub(super) const TENANT: &str = "dedupq-tenant";
pub(super) const KEY: &str = "dedupq-key";
pub(super) const FIRST_SEEN: &str = "dedupq-first-seen";
pub(super) const SOURCE_TOPIC: &str = "dedupq-source-topic";
pub(super) const SOURCE_PARTITION: &str = "dedupq-source-partition";
pub(super) const SOURCE_QUEUE: &str = "dedupq-source-queue";

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DeadLetter {
    /// Where it sits: `topic[partition]@offset`, or `queue#n` (n-th message).
    pub location: String,
    pub reason: Option<String>,
    pub tenant: Option<String>,
    pub key: Option<String>,
    pub first_seen: Option<DateTime<Utc>>,
    /// The topic or queue a replay publishes to.
    pub source: Option<String>,
    pub detail: Option<String>,
    pub bytes: usize,
    /// What dedupq's consumer (lapin) cannot parse in this RabbitMQ dead
    /// letter, if anything: a replay would only see it dead-lettered again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// What `replay` did or would do; absent for `list`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
}

/// Header values are untrusted bytes: shown lossily, never trusted as UTF-8.
pub(super) fn text(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

pub(super) fn time(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.trim())
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The identity headers of the configuration, read from the original
/// headers when dedupq recorded no tenant or key (input it refused before
/// parsing).
#[derive(Debug, Clone, Default)]
pub(super) struct IdentityHeaders {
    pub tenant: Option<String>,
    pub key: String,
}

impl IdentityHeaders {
    pub(super) fn from_settings(s: &crate::config::IdentitySettings) -> Self {
        Self {
            tenant: match &s.tenant {
                crate::config::TenantSource::Header { name } => Some(name.clone()),
                _ => None,
            },
            key: s.key_header.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct Filter {
    pub reason: Option<String>,
    pub tenant: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

impl Filter {
    pub(super) fn from_args(a: &DlqArgs) -> Self {
        Self {
            reason: a.reason.clone(),
            tenant: a.tenant.clone(),
            since: a.since,
            until: a.until,
        }
    }

    /// A dead letter without a time never matches a time filter.
    pub(super) fn matches(&self, d: &DeadLetter) -> bool {
        let same = |want: &Option<String>, got: &Option<String>| {
            want.as_ref().is_none_or(|w| got.as_deref() == Some(w))
        };
        same(&self.reason, &d.reason)
            && same(&self.tenant, &d.tenant)
            && self
                .since
                .is_none_or(|s| d.first_seen.is_some_and(|t| t >= s))
            && self
                .until
                .is_none_or(|u| d.first_seen.is_some_and(|t| t < u))
    }
}

impl Row for DeadLetter {
    const COLUMNS: &'static [&'static str] = &[
        "location",
        "reason",
        "tenant",
        "key",
        "first_seen",
        "source",
        "bytes",
        "replay",
    ];
    fn cells(&self) -> Vec<String> {
        let or_dash = |v: &Option<String>, max| v.as_deref().map_or("-".into(), |s| cell(s, max));
        vec![
            cell(&self.location, 48),
            or_dash(&self.reason, 20),
            or_dash(&self.tenant, 24),
            or_dash(&self.key, 40),
            self.first_seen
                .map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string()),
            or_dash(&self.source, 40),
            self.bytes.to_string(),
            or_dash(&self.replay, 60),
        ]
    }
}
