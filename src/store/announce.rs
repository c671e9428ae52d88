//! Retention across replicas that share one key table. The purge is
//! table-wide, so a replica configured with a short `retention.keep` would
//! purge keys that another replica (whose topics keep messages longer)
//! still needs. Each replica announces its keep in the `application_name`
//! of its upkeep connection, the one outside the pool that lives exactly as
//! long as the process; the upkeep leader purges with the longest keep a
//! live replica announces. A replica that dies stops announcing with its
//! session, so there is nothing to clean up.

use super::{Store, StoreError};
use sqlx::PgConnection;
use std::time::Duration;

/// Names this key table by its oid, so deployments on other schemas of
/// the same database never count (63 bytes at most, PostgreSQL's limit).
const ANNOUNCE_SQL: &str = "SELECT set_config('application_name', \
     'dedupq-upkeep ' || 'dedupq_keys'::regclass::oid || ' keep=' || $1::bigint, false)";

/// `application_name` is visible to every role in pg_stat_activity.
const LONGEST_SQL: &str = r#"
SELECT max(substring(application_name FROM ' keep=([0-9]+)$')::bigint)
FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name LIKE 'dedupq-upkeep ' || 'dedupq_keys'::regclass::oid || ' keep=%'
"#;

impl Store {
    /// Announces `keep` on this replica's upkeep connection.
    pub async fn announce_keep(conn: &mut PgConnection, keep: Duration) -> Result<(), StoreError> {
        let secs = i64::try_from(keep.as_secs()).unwrap_or(i64::MAX);
        sqlx::query(ANNOUNCE_SQL)
            .bind(secs)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// The longest keep announced by a live replica of this key table
    /// (None if none announced, e.g. only older releases run).
    pub async fn longest_announced_keep(
        conn: &mut PgConnection,
    ) -> Result<Option<Duration>, StoreError> {
        let secs: Option<i64> = sqlx::query_scalar(LONGEST_SQL)
            .fetch_one(&mut *conn)
            .await?;
        Ok(secs.map(|s| Duration::from_secs(s.max(0) as u64)))
    }
}
