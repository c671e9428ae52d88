//! Lease renewal for running handlers, retention, and the lock that makes
//! one replica the upkeep leader.

use super::{secs, sorted_order, Store, StoreError};
use crate::identity::{Epoch, Identity};
use sqlx::{Connection, Executor, PgConnection, Row};
use std::time::Duration;

/// The upkeep lock: a session advisory lock whose two keys are a constant
/// ("ddpq") and the oid of this key table, so deployments that share a
/// database but not a schema elect their leaders independently.
const UPKEEP_LOCK_SQL: &str =
    "SELECT pg_try_advisory_lock(1684303985, 'dedupq_keys'::regclass::oid::int4)";

const RENEW_SQL: &str = r#"
UPDATE dedupq_keys AS k SET
    lease_until = now() + make_interval(secs => $4),
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS u(tenant, key, epoch, ord)
WHERE k.tenant = u.tenant AND k.key = u.key
  AND k.epoch = u.epoch
  AND k.status = 'in_progress'
RETURNING u.ord
"#;

/// Finished rows only, oldest first, walked through the creation index (a
/// row finished before the cutoff was created before it): no index on the
/// completion time, which a finish would have to write. Rows created
/// before the cutoff that are still open or finished since are passed
/// over; rows another transaction holds are left for the next round rather
/// than waited on.
const PURGE_SQL: &str = r#"
WITH doomed AS (
    SELECT tenant, key FROM dedupq_keys
    WHERE (created_at < now() - make_interval(secs => $1))
      AND (completed_at < now() - make_interval(secs => $1))
      AND (status IN ('done', 'failed'))
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM dedupq_keys AS k USING doomed AS d
WHERE k.tenant = d.tenant AND k.key = d.key
  AND (k.status IN ('done', 'failed'))
"#;

/// What a lease renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// Extended: the claim is still this worker's.
    Held,
    /// The epoch moved on (or the key finished): the claim is gone.
    Lost,
    /// Another transaction holds the row past `store.lock_timeout`: not
    /// extended this time, and not lost either.
    Locked,
}

impl Store {
    /// Extends the leases of running claims in one round trip. Returns, in
    /// input order, what became of each (see [`Renewed`]); a row another
    /// transaction holds does not hold back the others.
    pub async fn renew_leases(
        &self,
        claims: &[(&Identity, Epoch)],
        lease: Duration,
    ) -> Result<Vec<Renewed>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&Identity> = claims.iter().map(|(id, _)| *id).collect();
        self.around_locks(
            &ids,
            || Renewed::Locked,
            |subset| async move {
                let some: Vec<(&Identity, Epoch)> = subset.iter().map(|&i| claims[i]).collect();
                let held = self.renew_statement(&some, lease).await?;
                Ok(held
                    .into_iter()
                    .map(|h| if h { Renewed::Held } else { Renewed::Lost })
                    .collect())
            },
        )
        .await
    }

    async fn renew_statement(
        &self,
        claims: &[(&Identity, Epoch)],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let order = sorted_order(claims, |(id, _)| (id.tenant.as_str(), id.key.as_str()));
        let tenants: Vec<&str> = order.iter().map(|&i| claims[i].0.tenant.as_str()).collect();
        let keys: Vec<&str> = order.iter().map(|&i| claims[i].0.key.as_str()).collect();
        let epochs: Vec<i64> = order.iter().map(|&i| claims[i].1 .0).collect();
        let rows = self
            .rows(|| {
                sqlx::query(RENEW_SQL)
                    .bind(&tenants)
                    .bind(&keys)
                    .bind(&epochs)
                    .bind(secs(lease))
            })
            .await?;
        let mut held = vec![false; claims.len()];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            held[order[(ord - 1) as usize]] = true;
        }
        Ok(held)
    }

    /// Deletes at most `limit` done/failed rows finished more than
    /// `older_than` ago. Never touches in_progress or unknown rows.
    pub async fn purge_batch(&self, older_than: Duration, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(PURGE_SQL)
            .bind(secs(older_than))
            .bind(limit)
            .execute(self.pool())
            .await
            .map_err(|e| self.noted(e))?;
        Ok(done.rows_affected())
    }

    /// A connection of its own, outside the pool, to hold the upkeep lock:
    /// a session lock lives exactly as long as its connection, so the lock
    /// goes with the process whichever way it ends. It sits idle between
    /// rounds on purpose, so an `idle_session_timeout` of the server or
    /// the role does not apply to it (it would end the leadership with
    /// every idle spell, and the replicas would take turns).
    pub async fn dedicated_connection(&self) -> Result<PgConnection, StoreError> {
        let mut conn = PgConnection::connect_with(&self.pool().connect_options()).await?;
        let session = format!("{}SET idle_session_timeout = 0;", self.session());
        conn.execute(sqlx::raw_sql(&session)).await?;
        Ok(conn)
    }

    /// Takes the upkeep lock on `conn` if no other session holds it.
    /// Re-taking a lock this session already holds succeeds (and stacks,
    /// which is harmless: the lock ends with the connection).
    pub async fn try_upkeep_lock(conn: &mut PgConnection) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(UPKEEP_LOCK_SQL)
            .fetch_one(&mut *conn)
            .await?)
    }

    /// Is the connection that holds the upkeep lock still alive?
    pub async fn check_connection(conn: &mut PgConnection) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        Ok(())
    }

    /// Purges in bounded batches until nothing older is left; each batch is
    /// its own short transaction so the table is never locked for long.
    pub async fn purge(&self, older_than: Duration, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let n = self.purge_batch(older_than, batch).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }
}
