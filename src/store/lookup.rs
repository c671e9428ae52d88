//! Reading one key's state without claiming it: what the HTTP API answers a
//! repeated request of an async route (the consumer claims, not the API).

use super::{KeyStatus, Store, StoreError, StoredResult};
use crate::fingerprint::Fingerprint;
use crate::identity::Identity;
use serde_json::Value;
use sqlx::Row;

const LOOKUP_SQL: &str = "SELECT status, fingerprint, fingerprint_version, result_status, \
     result_body FROM dedupq_keys WHERE tenant = $1 AND key = $2";

/// A key row as a repeat of its request needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyState {
    pub status: KeyStatus,
    pub fingerprint: Fingerprint,
    /// Set once the key is done or failed.
    pub result: Option<StoredResult>,
}

impl KeyState {
    /// Whether `fingerprint` names another operation than the stored one.
    /// A row stored under another fingerprint version cannot be compared;
    /// the key alone decides, as in the claim.
    pub fn conflicts_with(&self, fingerprint: &Fingerprint) -> bool {
        self.fingerprint.version == fingerprint.version
            && self.fingerprint.digest != fingerprint.digest
    }
}

impl Store {
    /// The key's state, or None when it was never claimed (or was purged).
    pub async fn lookup(&self, id: &Identity) -> Result<Option<KeyState>, StoreError> {
        let Some(row) = sqlx::query(LOOKUP_SQL)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .fetch_optional(self.pool())
            .await?
        else {
            return Ok(None);
        };
        let status = KeyStatus::parse(row.try_get("status")?)?;
        let digest: Vec<u8> = row.try_get("fingerprint")?;
        let digest: [u8; 32] = digest.try_into().map_err(|d: Vec<u8>| {
            StoreError::Corrupt(format!("fingerprint of {} bytes", d.len()))
        })?;
        let result = match status {
            KeyStatus::Done | KeyStatus::Failed => Some(StoredResult {
                status,
                result_status: row
                    .try_get::<Option<i32>, _>("result_status")?
                    .unwrap_or_default(),
                body: row
                    .try_get::<Option<Value>, _>("result_body")?
                    .unwrap_or(Value::Null),
            }),
            KeyStatus::InProgress | KeyStatus::Unknown => None,
        };
        Ok(Some(KeyState {
            status,
            fingerprint: Fingerprint {
                version: row.try_get("fingerprint_version")?,
                digest,
            },
            result,
        }))
    }
}
