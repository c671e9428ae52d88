//! (f) The floor of any PostgreSQL-backed deduplication: the narrowest
//! claim table (tenant, key as primary key, status), one
//! `INSERT … ON CONFLICT DO NOTHING RETURNING` over arrays and one `UPDATE`
//! per batch, as a hand-written batch consumer does it; no lease, no
//! fingerprint, no fencing, no stored request or result. Same keys, batch
//! size and connections as (d).

use super::case::{Job, Measured};
use super::pg_limit::{identities, measure_batches, BATCH};
use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const TABLE_SQL: &str = r#"
CREATE TABLE IF NOT EXISTS claims (
    tenant text COLLATE "C" NOT NULL,
    key    text COLLATE "C" NOT NULL,
    status text NOT NULL,
    PRIMARY KEY (tenant, key)
)
"#;

const CLAIM_SQL: &str = r#"
INSERT INTO claims (tenant, key, status)
SELECT tenant, key, 'in_progress' FROM unnest($1::text[], $2::text[]) AS u(tenant, key)
ON CONFLICT DO NOTHING
RETURNING key
"#;

const FINISH_SQL: &str = r#"
UPDATE claims AS c SET status = 'done'
FROM unnest($1::text[], $2::text[]) AS u(tenant, key)
WHERE c.tenant = u.tenant AND c.key = u.key
"#;

pub(super) async fn run(job: &Job) -> anyhow::Result<Measured> {
    let connections = job.case.partitions.max(1) as usize;
    let pool = pool(job, connections).await?;
    let keys: Vec<(String, String)> = identities(job.expected)?
        .into_iter()
        .map(|(id, ..)| (id.tenant.as_str().to_string(), id.key.as_str().to_string()))
        .collect();
    let measured = measure_batches(
        job,
        connections,
        pool.clone(),
        keys,
        |pool, keys, next| async move { drive(&pool, &keys, &next).await },
    )
    .await;
    pool.close().await;
    measured
}

/// A pool on the case's schema, with the claim table created in it.
async fn pool(job: &Job, connections: usize) -> anyhow::Result<PgPool> {
    let admin = PgPool::connect(&job.database_url).await?;
    let schema = job.schema.replace('"', "\"\"");
    let create = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
    sqlx::query(&create).execute(&admin).await?;
    admin.close().await;
    let options = PgConnectOptions::from_str(&job.database_url)?
        .options([("search_path", job.schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(connections as u32)
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(TABLE_SQL).execute(&pool).await?;
    Ok(pool)
}

/// Claims and finishes batches until every key is taken; returns each
/// batch's duration (ms).
async fn drive(
    pool: &PgPool,
    keys: &[(String, String)],
    next: &AtomicUsize,
) -> anyhow::Result<Vec<f64>> {
    let mut durations = Vec::new();
    loop {
        let from = next.fetch_add(BATCH, Ordering::Relaxed);
        if from >= keys.len() {
            return Ok(durations);
        }
        let chunk = &keys[from..(from + BATCH).min(keys.len())];
        let t = Instant::now();
        let tenants: Vec<&str> = chunk.iter().map(|(t, _)| t.as_str()).collect();
        let names: Vec<&str> = chunk.iter().map(|(_, k)| k.as_str()).collect();
        let won: Vec<String> = sqlx::query_scalar(CLAIM_SQL)
            .bind(&tenants)
            .bind(&names)
            .fetch_all(pool)
            .await?;
        anyhow::ensure!(won.len() == chunk.len(), "fresh keys were not all won");
        let done = sqlx::query(FINISH_SQL)
            .bind(&tenants)
            .bind(&names)
            .execute(pool)
            .await?;
        anyhow::ensure!(done.rows_affected() == chunk.len() as u64);
        durations.push(t.elapsed().as_secs_f64() * 1000.0);
    }
}
