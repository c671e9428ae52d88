//! Operator interventions on one key (`dedupq keys release|settle|reset`).
//! Each runs in one transaction with the row locked, and writes an audit
//! row with the row as it was. Whether a lease is live is PostgreSQL's
//! answer, never the operator's clock: a CLI host running fast would
//! release a live lease.

use super::admin::{KeyRow, COLUMNS};
use super::{KeyStatus, Store, StoreError};
use crate::identity::Identity;
use chrono::{DateTime, Utc};
use sqlx::{Postgres, Row, Transaction};

/// What `release` found.
#[derive(Debug)]
pub enum Released {
    /// The lease is over and the audit line written; the row as it was.
    Done(Box<KeyRow>),
    /// Absent, done or failed: nothing to release.
    NotOpen,
    /// A worker holds a live lease: releasing now would let a second
    /// execution start while the first may still act.
    LeaseLive {
        /// When the live lease ends.
        until: DateTime<Utc>,
        /// The process holding it.
        owner: String,
    },
}

/// What an operator learned from the provider about an unknown key.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// It charged: `body` (what the provider says) is stored and replayed.
    Done {
        /// The status code duplicates are answered with.
        status: i32,
        /// The provider's answer, stored as `application/json`.
        body: Vec<u8>,
    },
    /// It did not charge, for good.
    Failed {
        /// The status code duplicates are answered with.
        status: i32,
        /// The provider's answer, stored as `application/json`.
        body: Vec<u8>,
    },
}

/// What `settle` and `reset` found.
#[derive(Debug)]
pub enum Repaired {
    /// Applied and the audit line written; the row as it was.
    Done(Box<KeyRow>),
    /// No such key: never claimed, or purged.
    Absent,
    /// The key is not in a state this repair applies to.
    Refused(Box<KeyRow>),
}

impl Store {
    /// Ends the lease of an open key now, so the next delivery takes it
    /// over (a held unknown key gets one more attempt with its stored
    /// request). Refused while the lease is live unless `force`. The epoch
    /// moves on, as at a takeover: the worker that held the key is fenced
    /// (its renewals and its outcome write nothing), so it cannot renew the
    /// lease the operator ended before the next delivery comes.
    pub async fn release_key(
        &self,
        id: &Identity,
        reason: &str,
        actor: &str,
        force: bool,
    ) -> Result<Released, StoreError> {
        let mut tx = self.pool().begin().await?;
        let Some((before, lease_live)) = locked(&mut tx, id).await? else {
            return Ok(Released::NotOpen);
        };
        if !matches!(before.status, KeyStatus::InProgress | KeyStatus::Unknown) {
            return Ok(Released::NotOpen);
        }
        if let Some(until) = before.lease_until.filter(|_| lease_live && !force) {
            return Ok(Released::LeaseLive {
                until,
                owner: before.owner.clone(),
            });
        }
        sqlx::query(
            "UPDATE dedupq_keys SET lease_until = now(), epoch = epoch + 1, \
             updated_at = now() WHERE tenant = $1 AND key = $2",
        )
        .bind(id.tenant.as_str())
        .bind(id.key.as_str())
        .execute(&mut *tx)
        .await?;
        let action = if force { "release_forced" } else { "release" };
        audit(&mut tx, id, action, reason, actor, &before).await?;
        tx.commit().await?;
        Ok(Released::Done(Box::new(before)))
    }

    /// Records what the provider says about a key whose outcome is
    /// unknown, or that is in progress past its lease (its worker gone
    /// and no delivery left to take it over, as after a crash whose
    /// client never retried or a failover that lost the outcome): no
    /// worker may hold it. Duplicates then replay it, and the epoch moves
    /// on, so a worker that held it once can write nothing more to it.
    pub async fn settle_key(
        &self,
        id: &Identity,
        settlement: &Settlement,
        reason: &str,
        actor: &str,
    ) -> Result<Repaired, StoreError> {
        let mut tx = self.pool().begin().await?;
        let Some((before, lease_live)) = locked(&mut tx, id).await? else {
            return Ok(Repaired::Absent);
        };
        let open = matches!(before.status, KeyStatus::Unknown | KeyStatus::InProgress);
        if !open || lease_live {
            return Ok(Repaired::Refused(Box::new(before)));
        }
        let (status, code, body) = match settlement {
            Settlement::Done { status, body } => ("done", status, body),
            Settlement::Failed { status, body } => ("failed", status, body),
        };
        sqlx::query(
            "UPDATE dedupq_keys SET status = $3, result_status = $4, result_body = $5, \
             result_content_type = 'application/json', lease_until = NULL, \
             attempt_open = false, uncertain_since = NULL, completed_at = now(), \
             epoch = epoch + 1, updated_at = now() WHERE tenant = $1 AND key = $2",
        )
        .bind(id.tenant.as_str())
        .bind(id.key.as_str())
        .bind(status)
        .bind(code)
        .bind(body)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            id,
            &format!("settle_{status}"),
            reason,
            actor,
            &before,
        )
        .await?;
        tx.commit().await?;
        Ok(Repaired::Done(Box::new(before)))
    }

    /// Forgets a finished key stored wrongly (e.g. `failed` because the
    /// handler was misconfigured): the next delivery runs it again, with
    /// the same derived key. Only done and failed keys.
    pub async fn reset_key(
        &self,
        id: &Identity,
        reason: &str,
        actor: &str,
    ) -> Result<Repaired, StoreError> {
        let mut tx = self.pool().begin().await?;
        let Some((before, _)) = locked(&mut tx, id).await? else {
            return Ok(Repaired::Absent);
        };
        if !matches!(before.status, KeyStatus::Done | KeyStatus::Failed) {
            return Ok(Repaired::Refused(Box::new(before)));
        }
        sqlx::query("DELETE FROM dedupq_keys WHERE tenant = $1 AND key = $2")
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .execute(&mut *tx)
            .await?;
        audit(&mut tx, id, "reset", reason, actor, &before).await?;
        tx.commit().await?;
        Ok(Repaired::Done(Box::new(before)))
    }
}

/// The key row, locked, and whether its lease is live by PostgreSQL's
/// clock (false for a row without one).
async fn locked(
    tx: &mut Transaction<'_, Postgres>,
    id: &Identity,
) -> Result<Option<(KeyRow, bool)>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS}, ((lease_until > now()) IS TRUE) AS lease_live \
         FROM dedupq_keys WHERE tenant = $1 AND key = $2 FOR UPDATE"
    );
    let Some(row) = sqlx::query(&sql)
        .bind(id.tenant.as_str())
        .bind(id.key.as_str())
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(None);
    };
    Ok(Some((KeyRow::from_row(&row)?, row.try_get("lease_live")?)))
}

async fn audit(
    tx: &mut Transaction<'_, Postgres>,
    id: &Identity,
    action: &str,
    reason: &str,
    actor: &str,
    before: &KeyRow,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO dedupq_key_audit (tenant, key, action, reason, actor, before) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id.tenant.as_str())
    .bind(id.key.as_str())
    .bind(action)
    .bind(reason)
    .bind(actor)
    .bind(sqlx::types::Json(before))
    .execute(&mut **tx)
    .await?;
    Ok(())
}
