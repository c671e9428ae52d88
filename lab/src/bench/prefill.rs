//! A key table with millions of finished keys (1M, 10M, 50M), filled once
//! with `INSERT … SELECT generate_series` statements of `CHUNK` keys and
//! kept between runs. Keys are spread evenly over the 32-hex-digit key
//! space, so the benchmark's random keys land between them all over the
//! index, as in production.

use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::store::Store;
use std::time::Instant;

/// The first 14 hex digits of a key hold `g * stride(rows)`.
const SPAN: i64 = 1 << 56;
/// Keys per fill statement: each commits on its own, so an interrupted
/// fill goes on from the last whole chunk.
const CHUNK: i64 = 5_000_000;

/// `g * stride` for g in 1..=rows spans the first 14 hex digits (10M
/// keys: 7 205 759 403).
fn stride(rows: i64) -> i64 {
    SPAN / rows
}

/// Finished keys as dedupq leaves them (answer and its content type as
/// bytes, no open attempt), created and finished evenly over the last day.
const FILL_SQL: &str = r#"
INSERT INTO dedupq_keys
    (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until,
     owner, attempts, result_status, result_body, result_content_type,
     created_at, updated_at, completed_at)
SELECT 'bench', lpad(to_hex(g * $4::bigint), 14, '0') || '-prefill-000000000',
       sha256(int8send(g)), 2, 'done', 1, NULL, 'prefill', 1, 200,
       convert_to('{"charged":true}', 'UTF8'), 'application/json',
       t, t, t
FROM generate_series($1::bigint, $2::bigint) AS g,
     LATERAL (SELECT now() - interval '1 day' + g * (interval '1 day' / $3::bigint)) AS c(t)
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

fn key_of(g: i64, rows: i64) -> String {
    format!("{:014x}-prefill-000000000", g * stride(rows))
}

/// Makes sure `schema` holds the `rows` prefilled keys; returns what it did.
/// A key table it creates gets `partitions` hash partitions (the run's
/// `store.partitions`); one that exists is used as it is.
pub(super) async fn ensure(
    database_url: &str,
    schema: &str,
    rows: i64,
    partitions: u32,
) -> anyhow::Result<String> {
    let store = Store::connect_lazy(&StoreSettings {
        url: SecretUrl::new(database_url),
        schema: Some(schema.into()),
        max_connections: 1,
        partitions,
        // The fill's ALTER TABLE and VACUUM wait behind autovacuum, which
        // on one partition of millions of keys runs for minutes.
        lock_timeout: std::time::Duration::from_secs(3600),
        statement_deadline: std::time::Duration::from_secs(7200),
        ..StoreSettings::default()
    })?;
    store.migrate(Some(schema)).await?;
    // A chunk is one statement: its last key exists only if all do.
    let chunks: Vec<(i64, i64)> = (0..)
        .map(|c| c * CHUNK + 1)
        .take_while(|&first| first <= rows)
        .map(|first| (first, (first + CHUNK - 1).min(rows)))
        .collect();
    let mut missing = Vec::new();
    for &(first, last) in &chunks {
        let present: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM dedupq_keys WHERE tenant = 'bench' AND key = $1)",
        )
        .bind(key_of(last, rows))
        .fetch_one(store.pool())
        .await?;
        if !present {
            missing.push((first, last));
        }
    }
    if missing.is_empty() {
        let removed = remove_added(&store, rows).await?;
        let warmed = prewarm(&store).await;
        return Ok(format!(
            "{schema}: {rows} prefilled keys present, reused; {removed}; {warmed}"
        ));
    }
    eprintln!("filling {schema} with {rows} keys (once; takes minutes)…");
    let t = Instant::now();
    if missing.len() == chunks.len() {
        sqlx::query("DELETE FROM dedupq_keys")
            .execute(store.pool())
            .await?;
    }
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
    for (first, last) in missing {
        sqlx::query(FILL_SQL)
            .bind(first)
            .bind(last)
            .bind(rows)
            .bind(stride(rows))
            .execute(store.pool())
            .await?;
        eprintln!(
            "  {schema}: keys {first}..={last} ({:.0} s)",
            t.elapsed().as_secs_f64()
        );
    }
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
    // The fill's WAL is checkpointed now, not during the first rows.
    sqlx::query("CHECKPOINT").execute(store.pool()).await?;
    let warmed = prewarm(&store).await;
    Ok(format!(
        "{schema}: filled {rows} keys in {:.0} s; {warmed}",
        t.elapsed().as_secs_f64()
    ))
}

/// Deletes the keys earlier runs claimed (created after the last
/// prefilled one), so that every run meets the table at `rows` keys, and
/// vacuums their entries out of the indexes; says what it did.
async fn remove_added(store: &Store, rows: i64) -> anyhow::Result<String> {
    let removed = sqlx::query(
        "DELETE FROM dedupq_keys WHERE created_at > \
         (SELECT created_at FROM dedupq_keys WHERE tenant = 'bench' AND key = $1)",
    )
    .bind(key_of(rows, rows))
    .execute(store.pool())
    .await?
    .rows_affected();
    if removed > 0 {
        sqlx::query("VACUUM dedupq_keys")
            .execute(store.pool())
            .await?;
        sqlx::query("CHECKPOINT").execute(store.pool()).await?;
    }
    Ok(format!("{removed} keys of earlier runs removed"))
}

/// Loads the primary key into PostgreSQL's buffers, as a server that has
/// been running holds it (`pg_prewarm`, from PostgreSQL's contrib); says
/// what it did. A server without the extension is measured as it is.
async fn prewarm(store: &Store) -> String {
    let warm = async {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_prewarm SCHEMA public")
            .execute(store.pool())
            .await?;
        // Wherever the extension was created: the store's search path is
        // the key table's schema alone.
        let home: String = sqlx::query_scalar(
            "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension \
             WHERE extname = 'pg_prewarm'",
        )
        .fetch_one(store.pool())
        .await?;
        sqlx::query_scalar::<_, i64>(&format!(
            "SELECT coalesce(sum({home}.pg_prewarm(i.indexrelid::regclass)), 0)::int8 \
             FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indrelid \
             WHERE h.inhparent = 'dedupq_keys'::regclass AND i.indisprimary"
        ))
        .fetch_one(store.pool())
        .await
    };
    match warm.await {
        Ok(blocks) => format!("primary key prewarmed ({} MB)", blocks * 8 / 1024),
        Err(e) => format!("primary key not prewarmed ({e})"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefilled_keys_are_fixed_width_and_ordered_like_g() {
        for rows in [1_000_000, 10_000_000, 50_000_000] {
            let (a, b) = (super::key_of(1, rows), super::key_of(rows, rows));
            assert_eq!(a.len(), 32);
            assert_eq!(b.len(), 32);
            assert!(a < b);
        }
        assert_eq!(super::stride(10_000_000), 7_205_759_403);
    }
}
