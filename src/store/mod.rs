//! The PostgreSQL claim store: every statement that touches `dedupq_keys`.
//! Batch-first: each public write takes a slice and costs one round trip.

mod admin;
mod announce;
mod claim;
mod connect;
mod error;
mod finish;
mod lookup;
mod maintenance;
mod repair;
mod schema;
mod transactional;

pub use admin::{KeyFilter, KeyRow};
pub use claim::{Claim, ClaimRequest, ClaimResult, StoredRequest, StoredResult};
pub use connect::Store;
pub use error::StoreError;
pub use finish::{Answer, Finish, FinishWrite};
pub use lookup::KeyState;
pub use repair::{Released, Repaired, Settlement};
pub use schema::Pending;
pub use transactional::TxClaim;

use serde::Serialize;

/// The state column of a key row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    InProgress,
    Done,
    Failed,
    Unknown,
}

impl KeyStatus {
    pub const ALL: [KeyStatus; 4] = [
        KeyStatus::InProgress,
        KeyStatus::Done,
        KeyStatus::Failed,
        KeyStatus::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::InProgress => "in_progress",
            KeyStatus::Done => "done",
            KeyStatus::Failed => "failed",
            KeyStatus::Unknown => "unknown",
        }
    }

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
fn sorted_order<T>(items: &[T], key: impl Fn(&T) -> (&str, &str)) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| key(&items[a]).cmp(&key(&items[b])));
    order
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}
