//! Claiming a batch of keys: one statement, one round trip.

use super::{secs, sorted_order, KeyStatus, Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::identity::{Epoch, Identity};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use std::time::Duration;

/// Insert every key; where it exists, take it over only if it is open
/// (in_progress or unknown), its lease is over and it is the same operation.
/// The outer SELECT reads the table as of the statement's snapshot (it does
/// not see the CTE's writes), which tells duplicates, held keys and
/// conflicts apart in the same round trip.
const CLAIM_SQL: &str = r#"
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int2[])
        WITH ORDINALITY AS i(tenant, key, fingerprint, fingerprint_version, ord)
),
claimed AS (
    INSERT INTO dedupq_keys AS k
        (tenant, key, fingerprint, fingerprint_version, status, epoch,
         lease_until, owner, attempts)
    SELECT tenant, key, fingerprint, fingerprint_version, 'in_progress', 1,
           now() + make_interval(secs => $5), $6, 1
    FROM input ORDER BY ord
    ON CONFLICT (tenant, key) DO UPDATE SET
        status = 'in_progress',
        epoch = k.epoch + 1,
        lease_until = EXCLUDED.lease_until,
        owner = EXCLUDED.owner,
        attempts = k.attempts + 1,
        updated_at = now()
    WHERE (k.status IN ('in_progress', 'unknown'))
      AND (k.lease_until <= now())
      AND ((k.fingerprint_version <> EXCLUDED.fingerprint_version)
           OR (k.fingerprint = EXCLUDED.fingerprint))
    RETURNING k.tenant, k.key, k.epoch, k.attempts, (xmax = 0) AS inserted
)
SELECT i.ord,
       c.epoch AS claimed_epoch, c.attempts AS claimed_attempts, c.inserted,
       k.status, k.fingerprint, k.fingerprint_version, k.lease_until,
       k.result_status, k.result_body
FROM input i
LEFT JOIN claimed c ON c.tenant = i.tenant AND c.key = i.key
LEFT JOIN dedupq_keys k ON k.tenant = i.tenant AND k.key = i.key
ORDER BY i.ord
"#;

pub struct ClaimRequest<'a> {
    pub identity: &'a Identity,
    pub fingerprint: &'a Fingerprint,
}

/// What a finished key stored; replayed to duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResult {
    pub status: KeyStatus,
    pub result_status: i32,
    pub body: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClaimResult {
    /// New key: this worker owns it.
    Won { epoch: Epoch, attempts: i32 },
    /// The previous owner's lease was over: this worker owns it now.
    TakenOver { epoch: Epoch, attempts: i32 },
    /// Finished before, same operation: replay the stored result.
    Duplicate(StoredResult),
    /// Someone else holds a live lease on it.
    Held { lease_until: DateTime<Utc> },
    /// Same key, different operation.
    Conflict,
    /// A concurrent claimer committed the row after this statement's
    /// snapshot was taken: claim again to learn its state.
    Contended,
}

impl Store {
    /// Claims every request in one round trip. The requests must have
    /// distinct identities (PostgreSQL refuses to touch a row twice in one
    /// statement); results come back in request order.
    pub async fn claim_batch(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<ClaimResult>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let order = sorted_order(requests, |r| {
            (r.identity.tenant.as_str(), r.identity.key.as_str())
        });
        let tenants: Vec<&str> = order
            .iter()
            .map(|&i| requests[i].identity.tenant.as_str())
            .collect();
        let keys: Vec<&str> = order
            .iter()
            .map(|&i| requests[i].identity.key.as_str())
            .collect();
        let digests: Vec<&[u8]> = order
            .iter()
            .map(|&i| &requests[i].fingerprint.digest[..])
            .collect();
        let versions: Vec<i16> = order
            .iter()
            .map(|&i| requests[i].fingerprint.version)
            .collect();

        let rows = sqlx::query(CLAIM_SQL)
            .bind(&tenants)
            .bind(&keys)
            .bind(&digests)
            .bind(&versions)
            .bind(secs(lease))
            .bind(owner)
            .fetch_all(self.pool())
            .await?;

        let mut results = vec![ClaimResult::Contended; requests.len()];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            let request_index = order[(ord - 1) as usize];
            results[request_index] = classify(&row, requests[request_index].fingerprint)?;
        }
        Ok(results)
    }
}

pub(super) fn classify(
    row: &sqlx::postgres::PgRow,
    fingerprint: &Fingerprint,
) -> Result<ClaimResult, StoreError> {
    if let Some(epoch) = row.try_get::<Option<i64>, _>("claimed_epoch")? {
        let attempts: i32 = row.try_get("claimed_attempts")?;
        return Ok(if row.try_get::<bool, _>("inserted")? {
            ClaimResult::Won {
                epoch: Epoch(epoch),
                attempts,
            }
        } else {
            ClaimResult::TakenOver {
                epoch: Epoch(epoch),
                attempts,
            }
        });
    }
    let Some(status) = row.try_get::<Option<String>, _>("status")? else {
        return Ok(ClaimResult::Contended);
    };
    let stored_digest: Vec<u8> = row.try_get("fingerprint")?;
    let stored_version: i16 = row.try_get("fingerprint_version")?;
    // A row stored under another fingerprint definition cannot be compared;
    // the key alone decides (see FingerprintSpec::version).
    if stored_version == fingerprint.version && stored_digest != fingerprint.digest {
        return Ok(ClaimResult::Conflict);
    }
    Ok(match KeyStatus::parse(&status)? {
        status @ (KeyStatus::Done | KeyStatus::Failed) => ClaimResult::Duplicate(StoredResult {
            status,
            result_status: row
                .try_get::<Option<i32>, _>("result_status")?
                .unwrap_or_default(),
            body: row
                .try_get::<Option<Value>, _>("result_body")?
                .unwrap_or(Value::Null),
        }),
        KeyStatus::InProgress | KeyStatus::Unknown => ClaimResult::Held {
            lease_until: row
                .try_get::<Option<DateTime<Utc>>, _>("lease_until")?
                .unwrap_or_else(Utc::now),
        },
    })
}
