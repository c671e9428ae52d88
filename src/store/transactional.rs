//! Same-database mode: when the handler's work is writes to this
//! PostgreSQL, claim, work and result commit in one transaction. No lease:
//! a concurrent duplicate waits on the primary key until the first commits
//! (then sees it done) or rolls back (then claims it).

use super::claim::classify;
use super::connect::default_planner_sql;
use super::{ClaimRequest, ClaimResult, Store, StoreError, StoredResult};
use crate::identity::Identity;
use sqlx::{Executor, PgConnection, Postgres, Transaction};
use std::time::Duration;

const TX_CLAIM_SQL: &str = r#"
INSERT INTO dedupq_keys
    (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until, owner,
     attempts, attempt_open, request_body, request_content_type, derived_key, route)
VALUES ($1, $2, $3, $4, 'in_progress', 1, NULL, $5, 1, true, $6, $7, $8, $9)
ON CONFLICT (tenant, key) DO NOTHING
RETURNING epoch
"#;

const READ_ONE_SQL: &str = r#"
SELECT NULL::int8 AS claimed_epoch, NULL::int4 AS claimed_attempts,
       NULL::int4 AS claimed_counted, NULL::bool AS inserted,
       NULL::bytea AS stored_body, NULL::text AS stored_content_type,
       NULL::text AS stored_derived_key, NULL::float8 AS claimed_age,
       status, fingerprint, fingerprint_version, lease_until,
       ((lease_until <= now()) IS TRUE) AS lease_over,
       extract(epoch FROM (lease_until - now()))::float8 AS lease_left, attempts,
       ((status = 'unknown') OR attempt_open) AS uncertain,
       result_status, result_body, result_content_type, route
FROM dedupq_keys WHERE tenant = $1 AND key = $2
"#;

const TX_FINISH_SQL: &str = r#"
UPDATE dedupq_keys SET
    status = $3, result_status = $4, result_body = $5, result_content_type = $6,
    attempt_open = false, completed_at = now(), updated_at = now()
WHERE tenant = $1 AND key = $2 AND status = 'in_progress'
"#;

/// Undoes the handler's writes back to the savepoint `begin_handler` set.
const ROLLBACK_HANDLER_SQL: &str = "ROLLBACK TO SAVEPOINT dedupq_handler";

/// What a same-database claim found.
pub enum TxClaim {
    /// The key is ours inside this open transaction.
    Owned(Transaction<'static, Postgres>),
    /// The key exists (committed by someone else): what it is.
    Settled(ClaimResult),
}

impl Store {
    /// Inserts the key in a new transaction. If the insert wins, the key is
    /// owned with that transaction: the handler's writes and the result
    /// commit or roll back together. If the key exists, the row is read
    /// (after a concurrent inserter has committed) and classified as a batch
    /// claim would (`Contended` if it is gone again).
    pub async fn claim_in_transaction(
        &self,
        request: &ClaimRequest<'_>,
        owner: &str,
    ) -> Result<TxClaim, StoreError> {
        let id = request.identity;
        let mut tx = self.pool().begin().await.map_err(|e| self.noted(e))?;
        let inserted = sqlx::query(TX_CLAIM_SQL)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .bind(&request.fingerprint.digest[..])
            .bind(request.fingerprint.version)
            .bind(owner)
            .bind(request.body)
            .bind(request.content_type)
            .bind(request.derived_key)
            .bind(request.route)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.noted(e));
        let inserted = match inserted {
            // A concurrent duplicate's transaction holds the key longer than
            // store.lock_timeout: it is in flight; look again later.
            Err(e) if e.is_lock_wait() => return Ok(TxClaim::Settled(ClaimResult::Locked)),
            other => other?,
        };
        if inserted.is_some() {
            return Ok(TxClaim::Owned(tx));
        }
        tx.rollback().await?;
        let row = sqlx::query(READ_ONE_SQL)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .fetch_optional(self.pool())
            .await?;
        Ok(TxClaim::Settled(match row {
            Some(row) => classify(&row, request.fingerprint, request.route)?,
            None => ClaimResult::Contended,
        }))
    }

    /// Bounds the handler's statements inside the claim's transaction and
    /// marks where its writes begin. PostgreSQL itself ends a handler
    /// statement that runs past `timeout`, so an abandoned attempt does not
    /// hold the key's row (and its connection) for as long as the statement
    /// would have run. The handler's own statements wait for locks as long
    /// as the timeout allows, not store.lock_timeout (which is for dedupq's
    /// statements over many keys).
    pub async fn begin_handler(
        conn: &mut PgConnection,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let limit = format!(
            "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = 0; {} SAVEPOINT dedupq_handler",
            timeout.as_millis().max(1),
            default_planner_sql(true)
        );
        conn.execute(sqlx::raw_sql(&limit)).await?;
        Ok(())
    }

    /// Rolls back the handler's writes since [`Store::begin_handler`],
    /// keeping the claim: a permanent failure is stored without them.
    pub async fn roll_back_handler(conn: &mut PgConnection) -> Result<(), StoreError> {
        sqlx::query(ROLLBACK_HANDLER_SQL).execute(conn).await?;
        Ok(())
    }

    /// Stores a done or failed result inside the claim's transaction.
    pub async fn finish_in_transaction(
        conn: &mut PgConnection,
        id: &Identity,
        result: &StoredResult,
    ) -> Result<(), StoreError> {
        sqlx::query(TX_FINISH_SQL)
            .bind(id.tenant.as_str())
            .bind(id.key.as_str())
            .bind(result.status.as_str())
            .bind(result.result_status)
            .bind(&result.body)
            .bind(result.content_type.as_deref())
            .execute(conn)
            .await?;
        Ok(())
    }
}
