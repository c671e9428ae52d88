//! Writes that end (or pause) a claim. Every one is fenced by the epoch the
//! claim returned: a write that matches no row means the lease was lost.

use super::{sorted_order, Store, StoreError};
use crate::identity::{Epoch, Identity};
use serde_json::Value;
use sqlx::Row;

#[cfg(not(feature = "broken-no-fencing"))]
const EPOCH_FENCE: &str = "AND k.epoch = u.epoch";
// Test-only: lets a stale worker overwrite the current owner's row, so the
// tests can show that they catch a store without fencing.
#[cfg(feature = "broken-no-fencing")]
const EPOCH_FENCE: &str = "";

/// One statement for a batch of finishes of any kind. `in_progress` with a
/// lease ending now is a release: the next delivery takes over at once.
///
/// "Still open" is spelled `completed_at IS NULL` (equivalent by the
/// table's CHECK) rather than by status: a status filter matches the
/// partial index of open keys, which the planner then scans whole — with
/// every dead entry a busy table leaves there — instead of looking each
/// key up by primary key.
fn finish_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            r#"
UPDATE dedupq_keys AS k SET
    status = u.status,
    result_status = u.result_status,
    result_body = u.result_body::jsonb,
    last_error = u.error,
    lease_until = CASE WHEN u.status IN ('done', 'failed') THEN NULL ELSE now() END,
    completed_at = CASE WHEN u.status IN ('done', 'failed') THEN now() ELSE NULL END,
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int4[], $6::text[], $7::text[])
    WITH ORDINALITY AS u(tenant, key, epoch, status, result_status, result_body, error, ord)
WHERE k.tenant = u.tenant AND k.key = u.key
  AND k.completed_at IS NULL
  {EPOCH_FENCE}
RETURNING u.ord
"#
        )
    })
}

/// How a claim ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The handler succeeded: store and replay the result.
    Done { status: i32, body: Value },
    /// The handler failed for good (declined, 4xx): stored and replayed too.
    Failed { status: i32, body: Value },
    /// A transient failure: give the key up so the next delivery takes over.
    Release { error: String },
    /// The call may or may not have had its effect: retry with the same key.
    Unknown { error: String },
}

impl Finish {
    fn columns(&self) -> (&'static str, Option<i32>, Option<String>, Option<&str>) {
        match self {
            Finish::Done { status, body } => ("done", Some(*status), Some(body.to_string()), None),
            Finish::Failed { status, body } => {
                ("failed", Some(*status), Some(body.to_string()), None)
            }
            Finish::Release { error } => ("in_progress", None, None, Some(error)),
            Finish::Unknown { error } => ("unknown", None, None, Some(error)),
        }
    }
}

pub struct FinishWrite<'a> {
    pub identity: &'a Identity,
    pub epoch: Epoch,
    pub finish: Finish,
}

impl Store {
    /// Applies every write in one round trip. Returns, in input order,
    /// whether each write landed; `false` means the epoch no longer matches
    /// (fenced): the caller lost the lease and must not commit or ack.
    pub async fn finish_batch(&self, writes: &[FinishWrite<'_>]) -> Result<Vec<bool>, StoreError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let order = sorted_order(writes, |w| {
            (w.identity.tenant.as_str(), w.identity.key.as_str())
        });
        let mut tenants = Vec::with_capacity(writes.len());
        let mut keys = Vec::with_capacity(writes.len());
        let mut epochs = Vec::with_capacity(writes.len());
        let mut statuses = Vec::with_capacity(writes.len());
        let mut result_statuses = Vec::with_capacity(writes.len());
        let mut bodies = Vec::with_capacity(writes.len());
        let mut errors = Vec::with_capacity(writes.len());
        for &i in &order {
            let w = &writes[i];
            let (status, result_status, body, error) = w.finish.columns();
            tenants.push(w.identity.tenant.as_str());
            keys.push(w.identity.key.as_str());
            epochs.push(w.epoch.0);
            statuses.push(status);
            result_statuses.push(result_status);
            bodies.push(body);
            errors.push(error);
        }
        let rows = sqlx::query(finish_sql())
            .bind(&tenants)
            .bind(&keys)
            .bind(&epochs)
            .bind(&statuses)
            .bind(&result_statuses)
            .bind(&bodies)
            .bind(&errors)
            .fetch_all(self.pool())
            .await?;
        let mut landed = vec![false; writes.len()];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            landed[order[(ord - 1) as usize]] = true;
        }
        Ok(landed)
    }
}
