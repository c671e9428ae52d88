//! The key table with 10 million finished keys, filled once with one
//! `INSERT … SELECT generate_series` and kept between runs. Keys are
//! spread evenly over the 32-hex-digit key space, so the benchmark's
//! random keys land between them all over the index, as in production.

use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::store::Store;
use std::time::Instant;

/// `g * STRIDE` for g in 1..=10M spans the first 14 hex digits.
const STRIDE: i64 = 7_205_759_403;

/// Finished keys as dedupq leaves them (answer and its content type as
/// bytes, no open attempt), created and finished evenly over the last day.
const FILL_SQL: &str = r#"
INSERT INTO dedupq_keys
    (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until,
     owner, attempts, result_status, result_body, result_content_type,
     created_at, updated_at, completed_at)
SELECT 'bench', lpad(to_hex(g * 7205759403), 14, '0') || '-prefill-000000000',
       sha256(int8send(g)), 2, 'done', 1, NULL, 'prefill', 1, 200,
       convert_to('{"charged":true}', 'UTF8'), 'application/json',
       t, t, t
FROM generate_series(1::bigint, $1::bigint) AS g,
     LATERAL (SELECT now() - interval '1 day' + g * (interval '1 day' / $1)) AS c(t)
"#;

/// The key table's partitions (its hash partitions, or the table itself
/// before it was partitioned) and the fill factor each has as the
/// migrations set it.
const PARTS_SQL: &str = r#"
SELECT c.oid::regclass::text,
       coalesce((SELECT option_value FROM pg_options_to_table(c.reloptions)
                 WHERE option_name = 'fillfactor'), '100')
FROM pg_class c
WHERE c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'dedupq_keys'::regclass)
   OR (c.oid = 'dedupq_keys'::regclass AND c.relkind = 'r')
"#;

fn key_of(g: i64) -> String {
    format!("{:014x}-prefill-000000000", g * STRIDE)
}

/// Makes sure `schema` holds the `rows` prefilled keys; returns what it did.
pub(super) async fn ensure(database_url: &str, schema: &str, rows: i64) -> anyhow::Result<String> {
    let store = Store::connect_lazy(&StoreSettings {
        url: SecretUrl::new(database_url),
        schema: Some(schema.into()),
        max_connections: 1,
        ..StoreSettings::default()
    })?;
    store.migrate(Some(schema)).await?;
    // The fill is one statement: its last key exists only if all do.
    let filled: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM dedupq_keys WHERE tenant = 'bench' AND key = $1)",
    )
    .bind(key_of(rows))
    .fetch_one(store.pool())
    .await?;
    if filled {
        return Ok(format!("{schema}: {rows} prefilled keys present, reused"));
    }
    eprintln!("filling {schema} with {rows} keys (once; takes minutes)…");
    let t = Instant::now();
    sqlx::query("DELETE FROM dedupq_keys")
        .execute(store.pool())
        .await?;
    // Finished rows are never updated again: they are filled packed, not
    // with the room the table keeps for finishes (which would double the
    // disk it takes); claims of new keys go to new pages either way.
    // The fill factor is a partition's, not the partitioned table's.
    let parts: Vec<(String, String)> = sqlx::query_as(PARTS_SQL).fetch_all(store.pool()).await?;
    for (part, _) in &parts {
        sqlx::query(&format!("ALTER TABLE {part} SET (fillfactor = 100)"))
            .execute(store.pool())
            .await?;
    }
    sqlx::query(FILL_SQL)
        .bind(rows)
        .execute(store.pool())
        .await?;
    for (part, fillfactor) in &parts {
        let restore = format!(
            "ALTER TABLE {part} SET (fillfactor = {})",
            fillfactor.parse::<u8>()?
        );
        sqlx::query(&restore).execute(store.pool()).await?;
    }
    // Hint bits and the visibility map set now, not during the run.
    sqlx::query("VACUUM (ANALYZE) dedupq_keys")
        .execute(store.pool())
        .await?;
    Ok(format!(
        "{schema}: filled {rows} keys in {:.0} s",
        t.elapsed().as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefilled_keys_are_fixed_width_and_ordered_like_g() {
        let (a, b) = (super::key_of(1), super::key_of(10_000_000));
        assert_eq!(a.len(), 32);
        assert_eq!(b.len(), 32);
        assert!(a < b);
    }
}
