//! The PostgreSQL claim store: every statement that touches `dedupq_keys`.
//! Batch-first: each public write takes a slice and costs one round trip.

mod admin;
mod announce;
mod claim;
mod connect;
mod error;
mod finish;
mod locks;
mod lookup;
mod maintenance;
mod preflight;
mod repair;
mod schema;
mod together;
mod transactional;

pub use admin::{AuditRow, KeyFilter, KeyRow, Scanned, ABANDONED_AFTER};
pub use claim::{Claim, ClaimRequest, ClaimResult, RowAt, StoredRequest, StoredResult};
pub use connect::Store;
pub use error::{StoreError, STORE_ERROR_CLASSES};
pub use finish::{Answer, Finish, FinishWrite, Refund, Written, HINTED_FROM};
pub use lookup::KeyState;
pub use maintenance::Renewed;
pub use preflight::{Missing, Server};
pub use repair::{Released, Repaired, Settlement};
pub use schema::Pending;
pub use schema::MIGRATE_LOCK;
pub use transactional::TxClaim;

use serde::Serialize;

/// The state column of a key row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    /// A worker holds the key under a lease. A message arriving while the
    /// lease is live is in flight and does not run; once the lease is over
    /// (or released), a message of the same operation takes the key over
    /// under the next epoch.
    InProgress,
    /// The handler succeeded and its answer is stored: a message of the same
    /// operation is a duplicate and gets that answer replayed, never run.
    Done,
    /// The handler failed for good and its answer is stored: replayed to
    /// duplicates like `Done`, never run again on its own.
    Failed,
    /// An attempt may or may not have had its effect. While its lease is
    /// live the key is held; after it, the next message retries with the
    /// stored request (same bytes, same derived key). With no lease at all
    /// the key is held for an operator and duplicates are answered unknown.
    Unknown,
}

impl KeyStatus {
    /// Every status a key row can have (the table's CHECK constraint).
    pub const ALL: [KeyStatus; 4] = [
        KeyStatus::InProgress,
        KeyStatus::Done,
        KeyStatus::Failed,
        KeyStatus::Unknown,
    ];

    /// The value of the `status` column (and of the `status` label).
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::InProgress => "in_progress",
            KeyStatus::Done => "done",
            KeyStatus::Failed => "failed",
            KeyStatus::Unknown => "unknown",
        }
    }

    /// Reads the `status` column; any other text is a row dedupq did not
    /// write ([`StoreError::Corrupt`]).
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "in_progress" => KeyStatus::InProgress,
            "done" => KeyStatus::Done,
            "failed" => KeyStatus::Failed,
            "unknown" => KeyStatus::Unknown,
            other => return Err(StoreError::Corrupt(format!("unknown status '{other}'"))),
        })
    }
}

/// Sorts batch inputs by identity so that concurrent batches lock rows in
/// the same order and cannot deadlock each other.
/// The text of the batch statements that reach keys by their identity
/// (`claim`, `finish`, `claim and finish`), as dedupq sends them; None
/// for another name. For tests that read how PostgreSQL plans them.
#[doc(hidden)]
pub fn statement_sql(name: &str) -> Option<&'static str> {
    match name {
        "claim" => Some(claim::claim_sql()),
        "finish" => Some(finish::finish_sql(finish::Reach::AtRow)),
        "claim and finish" => Some(together::together_sql(finish::Reach::AtRow)),
        _ => None,
    }
}

fn sorted_order<T>(items: &[T], key: impl Fn(&T) -> (&str, &str)) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| key(&items[a]).cmp(&key(&items[b])));
    order
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}
