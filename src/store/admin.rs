//! Operator reads and interventions on single keys (`dedupq keys …`).

use super::connect::default_planner_sql;
use super::{KeyStatus, Store, StoreError};
use crate::identity::Identity;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::postgres::PgRow;
use sqlx::{Executor, Postgres, Row, Transaction};

pub(super) const COLUMNS: &str =
    "tenant, key, encode(fingerprint, 'hex') AS fingerprint, fingerprint_version, \
    status, epoch, lease_until, owner, attempts, uncounted_attempts, result_status, result_body, \
    result_content_type, derived_key, last_error, \
    created_at, updated_at, completed_at";

/// One line of the audit table: a manual intervention on a key.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRow {
    /// The line's number, in the order written.
    pub id: i64,
    /// When it was written.
    pub at: DateTime<Utc>,
    /// The key's tenant.
    pub tenant: String,
    /// The key.
    pub key: String,
    /// What was done: `release`, `force_release`, `settle_done`,
    /// `settle_failed`, `reset`, `purge`…
    pub action: String,
    /// Why, as the operator said.
    pub reason: String,
    /// Who did it.
    pub actor: String,
    /// The row as it was before (JSON), where there was one.
    pub before: Option<Box<RawValue>>,
}

/// One key row as an operator sees it: what `dedupq keys show|list` print
/// and what an audit line keeps as the row before an intervention.
#[derive(Debug, Clone, Serialize)]
pub struct KeyRow {
    /// The tenant the key belongs to.
    pub tenant: String,
    /// The idempotency key.
    pub key: String,
    /// The stored fingerprint's digest, in hex.
    pub fingerprint: String,
    /// The fingerprint version it was stored under.
    pub fingerprint_version: i16,
    /// Where the key is in its life.
    pub status: KeyStatus,
    /// The fencing epoch of the latest claim or takeover.
    pub epoch: i64,
    /// When the current lease ends. None once done or failed, and for an
    /// unknown key held for an operator.
    pub lease_until: Option<DateTime<Utc>>,
    /// The process that made the latest claim (`host-pid-random` unless
    /// configured).
    pub owner: String,
    /// Attempts on the key that sent a request: the number the latest one
    /// carried (`X-Dedupq-Attempt`).
    pub attempts: i32,
    /// Of those, the ones that do not count towards `engine.max_attempts`
    /// (a fault, a 409 for a request still running, a failed probe).
    pub uncounted_attempts: i32,
    /// The stored answer's status code, once done or failed.
    pub result_status: Option<i32>,
    /// The stored answer: its JSON verbatim when it is JSON, else
    /// `{"base64": …}`.
    pub result_body: Option<Box<RawValue>>,
    /// The stored answer's media type.
    pub result_content_type: Option<String>,
    /// The provider key of the first attempt (None for rows stored before
    /// requests were kept).
    pub derived_key: Option<String>,
    /// Why the latest attempt was released or ended unknown (cleared when
    /// an attempt stores done or failed).
    pub last_error: Option<String>,
    /// When the key was first claimed.
    pub created_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// When it became done or failed (None while open).
    pub completed_at: Option<DateTime<Utc>>,
}

impl KeyRow {
    pub(super) fn from_row(row: &PgRow) -> Result<Self, StoreError> {
        Ok(Self {
            tenant: row.try_get("tenant")?,
            key: row.try_get("key")?,
            fingerprint: row.try_get("fingerprint")?,
            fingerprint_version: row.try_get("fingerprint_version")?,
            status: KeyStatus::parse(row.try_get("status")?)?,
            epoch: row.try_get("epoch")?,
            lease_until: row.try_get("lease_until")?,
            owner: row.try_get("owner")?,
            attempts: row.try_get("attempts")?,
            uncounted_attempts: row.try_get("uncounted_attempts")?,
            result_status: row.try_get("result_status")?,
            result_body: row
                .try_get::<Option<Vec<u8>>, _>("result_body")?
                .map(|b| body_for_display(&b)),
            result_content_type: row.try_get("result_content_type")?,
            derived_key: row.try_get("derived_key")?,
            last_error: row.try_get("last_error")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            completed_at: row.try_get("completed_at")?,
        })
    }
}

/// A stored answer shown to an operator: its JSON verbatim when it is
/// strict JSON (numbers as written), else its bytes in base64.
pub(super) fn body_for_display(bytes: &[u8]) -> Box<RawValue> {
    let verbatim = crate::json::parse(bytes)
        .ok()
        .and_then(|_| RawValue::from_string(String::from_utf8_lossy(bytes).into_owned()).ok());
    verbatim.unwrap_or_else(|| {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        let text = serde_json::json!({ "base64": encoded }).to_string();
        RawValue::from_string(text).expect("serde_json writes valid JSON")
    })
}

/// How long after its lease ended an `in_progress` key counts as
/// abandoned (`dedupq_keys_abandoned`): a crashed worker's message is
/// redelivered and taken over within a minute or two, so a key left this
/// long has no delivery coming (a sync request whose client never
/// retried, an outcome lost in a failover) and needs an operator.
pub const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// What one scan of the key table counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// Rows per status: in_progress, done, failed.
    pub counts: Vec<(KeyStatus, i64)>,
    /// `in_progress` rows whose lease ended over [`ABANDONED_AFTER`] ago.
    pub abandoned: i64,
}

/// Which keys `keys list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFilter {
    /// in_progress past its lease, or unknown: what needs an operator.
    Stuck,
    /// Every key in this status, most recently changed first.
    Status(KeyStatus),
}

impl Store {
    /// The whole row of one key, or None when it was never claimed (or was
    /// purged).
    pub async fn show_key(&self, id: &Identity) -> Result<Option<KeyRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM dedupq_keys WHERE tenant = $1 AND key = $2");
        let row = sqlx::query(&sql)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(KeyRow::from_row).transpose()
    }

    /// Keys matching `filter`, of one tenant or of all, at most `limit`.
    pub async fn list_keys(
        &self,
        filter: KeyFilter,
        tenant: Option<&str>,
        limit: i64,
    ) -> Result<Vec<KeyRow>, StoreError> {
        // $2 is the tenant or NULL (every tenant); $3 the status.
        let sql = match filter {
            // A scan of the table: in_progress keys are not indexed, so
            // that a finish writes no index (see migration 0003).
            KeyFilter::Stuck => format!(
                "SELECT {COLUMNS} FROM dedupq_keys \
                 WHERE ((status = 'unknown') OR ((status = 'in_progress') AND (lease_until <= now()))) \
                 AND (($2::text IS NULL) OR (tenant = $2)) \
                 ORDER BY lease_until LIMIT $1"
            ),
            // Through the partial index of uncertain keys.
            KeyFilter::Status(KeyStatus::Unknown) => format!(
                "SELECT {COLUMNS} FROM dedupq_keys \
                 WHERE (uncertain_since IS NOT NULL) AND (status = $3) \
                 AND (($2::text IS NULL) OR (tenant = $2)) \
                 ORDER BY updated_at DESC LIMIT $1"
            ),
            KeyFilter::Status(_) => format!(
                "SELECT {COLUMNS} FROM dedupq_keys \
                 WHERE (status = $3) AND (($2::text IS NULL) OR (tenant = $2)) \
                 ORDER BY updated_at DESC LIMIT $1"
            ),
        };
        let mut query = sqlx::query(&sql).bind(limit).bind(tenant);
        if let KeyFilter::Status(status) = filter {
            query = query.bind(status.as_str());
        }
        let mut tx = self.scanning().await?;
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter().map(KeyRow::from_row).collect()
    }

    /// The latest lines of the audit table (every manual intervention: a
    /// release, settle, reset or purge), newest first, optionally of one
    /// tenant or one key.
    pub async fn audit_log(
        &self,
        tenant: Option<&str>,
        key: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditRow>, StoreError> {
        let mut tx = self.scanning().await?;
        let rows = sqlx::query(
            "SELECT id, at, tenant, key, action, reason, actor, before::text AS before \
             FROM dedupq_key_audit \
             WHERE (($2::text IS NULL) OR (tenant = $2)) AND (($3::text IS NULL) OR (key = $3)) \
             ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .bind(tenant)
        .bind(key)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                let before: Option<String> = r.try_get("before")?;
                Ok(AuditRow {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    tenant: r.try_get("tenant")?,
                    key: r.try_get("key")?,
                    action: r.try_get("action")?,
                    reason: r.try_get("reason")?,
                    actor: r.try_get("actor")?,
                    before: before
                        .map(RawValue::from_string)
                        .transpose()
                        .map_err(|e| StoreError::Corrupt(format!("an audit line's row: {e}")))?,
                })
            })
            .collect()
    }

    /// The number of `unknown` keys, read through the partial index of
    /// uncertain keys (every unknown key is one): cheap however large the
    /// table is.
    pub async fn count_unknown(&self) -> Result<Vec<(KeyStatus, i64)>, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dedupq_keys \
             WHERE (uncertain_since IS NOT NULL) AND (status = 'unknown')",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(vec![(KeyStatus::Unknown, n)])
    }

    /// Row counts of the other statuses (in_progress, done, failed), and
    /// of the `in_progress` keys abandoned (lease ended over
    /// [`ABANDONED_AFTER`] ago): one scan of the whole table (no index
    /// tells them apart, so that a finish writes none), so call it rarely.
    pub async fn count_scanned(&self) -> Result<Scanned, StoreError> {
        let mut tx = self.scanning().await?;
        let rows = sqlx::query(
            "SELECT status, count(*) AS n, \
                    count(*) FILTER (WHERE (status = 'in_progress') \
                        AND (lease_until < now() - make_interval(secs => $1))) AS abandoned \
             FROM dedupq_keys WHERE status IN ('in_progress', 'done', 'failed') GROUP BY status",
        )
        .bind(super::secs(ABANDONED_AFTER))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut scanned = Scanned {
            counts: [KeyStatus::InProgress, KeyStatus::Done, KeyStatus::Failed]
                .map(|s| (s, 0))
                .to_vec(),
            abandoned: 0,
        };
        for row in rows {
            let status = KeyStatus::parse(row.try_get("status")?)?;
            if let Some(slot) = scanned.counts.iter_mut().find(|(s, _)| *s == status) {
                slot.1 = row.try_get("n")?;
            }
            scanned.abandoned += row.try_get::<i64, _>("abandoned")?;
        }
        Ok(scanned)
    }

    /// The key table's size on disk, its partitions summed (heap only): what
    /// a [`Store::count_scanned`] reads.
    pub async fn table_bytes(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(sum(pg_relation_size(i.inhrelid)), 0)::int8 \
             FROM pg_inherits i WHERE i.inhparent = 'dedupq_keys'::regclass",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// A transaction planned by PostgreSQL's defaults, for the
    /// reads that scan the table (or the audit table) on purpose: dedupq's
    /// connections plan for lookups by key (see `PLANNER` in connect.rs),
    /// which would walk a whole index in key order instead.
    async fn scanning(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool().begin().await?;
        tx.execute(sqlx::raw_sql(default_planner_sql(true))).await?;
        Ok(tx)
    }
}
