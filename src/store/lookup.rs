//! Reading one key's state without claiming it: what the HTTP API answers a
//! repeated request of an async route (the consumer claims, not the API).

use super::{KeyStatus, Store, StoreError, StoredResult};
use crate::fingerprint::Fingerprint;
use crate::identity::Identity;
use sqlx::Row;

const LOOKUP_SQL: &str = "SELECT status, fingerprint, fingerprint_version, result_status, \
     result_body, result_content_type, route, (lease_until IS NULL) AS no_lease \
     FROM dedupq_keys WHERE tenant = $1 AND key = $2";

/// A key row as a repeat of its request needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyState {
    /// Where the key is in its life.
    pub status: KeyStatus,
    /// The fingerprint version the row was stored under.
    pub fingerprint_version: i16,
    /// The stored fingerprint's digest, under that version.
    pub digest: Vec<u8>,
    /// Set once the key is done or failed.
    pub result: Option<StoredResult>,
    /// The HTTP route that first claimed the key; None from a queue.
    pub route: Option<String>,
    /// The row has no lease: an unknown key held for an operator (or a
    /// finished one).
    pub no_lease: bool,
}

impl KeyState {
    /// Whether `fingerprint` names another operation than the stored one,
    /// by the claim's rule: compared under the row's version (version-1
    /// rows with the legacy digest); another field set cannot be compared
    /// and the key alone decides.
    pub fn conflicts_with(&self, fingerprint: &Fingerprint) -> bool {
        fingerprint
            .digest_for(self.fingerprint_version)
            .is_some_and(|d| d[..] != self.digest[..])
    }
}

impl Store {
    /// The key's state, or None when it was never claimed (or was purged).
    pub async fn lookup(&self, id: &Identity) -> Result<Option<KeyState>, StoreError> {
        let rows = self
            .rows(|| {
                sqlx::query(LOOKUP_SQL)
                    .bind(id.tenant.as_str())
                    .bind(id.key.as_str())
            })
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let status = KeyStatus::parse(row.try_get("status")?)?;
        let result = match status {
            KeyStatus::Done | KeyStatus::Failed => Some(StoredResult::from_row(row, status)?),
            KeyStatus::InProgress | KeyStatus::Unknown => None,
        };
        Ok(Some(KeyState {
            status,
            fingerprint_version: row.try_get("fingerprint_version")?,
            digest: row.try_get("fingerprint")?,
            result,
            route: row.try_get("route")?,
            no_lease: row.try_get("no_lease")?,
        }))
    }
}
