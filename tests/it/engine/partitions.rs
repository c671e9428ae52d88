//! The key table is hash-partitioned on (tenant, key) by migration 0005:
//! with the partition count asked for, and, from a table of an earlier
//! release, keeping every key, outcome, audit line and grant.

use crate::support::{self, handlers::Recording, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::engine::{Incoming, Outcome};
use dedupq::store::Store;
use sqlx::migrate::Migrator;
use sqlx::{Executor, PgPool};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Partitioning strategy and partitions of the key table in `schema`.
async fn layout(pool: &PgPool, schema: &str) -> (Option<String>, i64) {
    sqlx::query_as(
        "SELECT (SELECT p.partstrat::text FROM pg_partitioned_table p WHERE p.partrelid = t.oid), \
                (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = t.oid) \
         FROM (SELECT to_regclass(format('%I.dedupq_keys', $1::text))::oid AS oid) t",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn admin() -> PgPool {
    PgPool::connect(&support::database_url()).await.unwrap()
}

/// `dedupq migrate <extra>` on `schema`, as the owner.
fn migrate_cli(schema: &str, extra: &[&str]) -> (bool, String) {
    match support::cli::migrate(&support::database_url(), schema, extra) {
        Ok(text) => (true, text),
        Err(text) => (false, text),
    }
}

#[tokio::test]
async fn migrate_with_four_partitions_makes_a_hash_partitioned_table_of_four() {
    let schema = unique("parts");
    let (ok, out) = migrate_cli(&schema, &["--partitions", "4"]);
    assert!(ok, "{out}");
    assert_eq!(layout(&admin().await, &schema).await, (Some("h".into()), 4));
}

#[tokio::test]
async fn a_fresh_migrate_makes_one_hash_partition_by_default() {
    let schema = unique("parts");
    let (ok, out) = migrate_cli(&schema, &[]);
    assert!(ok, "{out}");
    assert_eq!(layout(&admin().await, &schema).await, (Some("h".into()), 1));
}

#[tokio::test]
async fn a_partition_count_out_of_range_is_refused_before_anything_is_created() {
    let schema = unique("parts");
    for bad in ["0", "1025"] {
        let (ok, out) = migrate_cli(&schema, &["--partitions", bad]);
        assert!(!ok, "{bad} partitions accepted: {out}");
        assert!(out.contains("store.partitions"), "{out}");
    }
    assert_eq!(layout(&admin().await, &schema).await, (None, 0));
}

#[tokio::test]
async fn the_migration_itself_refuses_a_partition_count_out_of_range() {
    let schema = unique("parts");
    let store = owner_store(&schema);
    let failed = store
        .clone()
        .with_partitions(2000)
        .migrate(Some(&schema))
        .await;
    let e = format!("{:#}", anyhow::Error::from(failed.unwrap_err()));
    assert!(
        e.contains("dedupq.partitions = 2000 is out of range"),
        "{e}"
    );
}

fn owner_store(schema: &str) -> Store {
    Store::connect_lazy(&StoreSettings {
        url: SecretUrl::new(support::database_url()),
        schema: Some(schema.into()),
        max_connections: 4,
        ..StoreSettings::default()
    })
    .unwrap()
}

/// The migrations of this build up to `last` (and a replacement for
/// migration 0005 when given), in a directory of their own, as a migrator
/// of an earlier release (or of a broken one) would carry them.
async fn migrator(last: i64, broken_0005: Option<&str>) -> Migrator {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let dir = std::env::temp_dir().join(unique("dedupq-migrations"));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let version: i64 = name[..4].parse().unwrap();
        if version <= last {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    if let Some(sql) = broken_0005 {
        std::fs::write(dir.join("0005_partitioned_keys.sql"), sql).unwrap();
    }
    let mut migrator = Migrator::new(dir.as_path()).await.unwrap();
    // Each test migrates a schema of its own: sqlx's lock (one advisory
    // lock per database) would only make it wait for the other tests'
    // migrations, and give up at the store's lock_timeout.
    migrator.set_locking(false);
    migrator
}

/// Keys of every status as an earlier release left them: payments run by
/// the engine (done, with their answers), and a few thousand rows written
/// directly — done and failed with answers (odd bytes included), unknown
/// keys held for an operator, in-progress keys under live leases and
/// mid-call — plus audit lines.
async fn fill(store: &Store) -> Vec<Incoming> {
    let engine = support::engine(
        store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    let paid: Vec<_> = (0..20)
        .map(|i| {
            support::message(
                "acme",
                &format!("paid-{i}"),
                &format!(r#"{{"amount":{i}}}"#),
            )
        })
        .collect();
    let decisions = engine.process(&paid).await.unwrap();
    assert!(decisions.iter().all(|d| d.outcome == Outcome::Processed));
    store
        .pool()
        .execute(
            r#"
INSERT INTO dedupq_keys
    (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until, owner,
     attempts, result_status, result_body, result_content_type, last_error,
     completed_at, request_body, request_content_type, derived_key, attempt_open,
     uncertain_since, route, created_at, updated_at)
SELECT 'tenant-' || (g % 7), 'bulk-' || g, sha256(int8send(g)), 1 + (g % 2)::int2, s.status,
       1 + g % 5,
       CASE s.status WHEN 'in_progress' THEN now() + interval '1 hour' END,
       'worker-' || (g % 3), 1 + g % 4,
       CASE WHEN s.status IN ('done', 'failed') THEN 200 + g % 300 END,
       CASE WHEN s.status IN ('done', 'failed') THEN '\x00ff'::bytea || int8send(g) END,
       CASE WHEN s.status IN ('done', 'failed') THEN 'application/octet-stream' END,
       CASE s.status WHEN 'failed' THEN 'declined ' || g END,
       CASE WHEN s.status IN ('done', 'failed') THEN now() - g * interval '1 second' END,
       convert_to('{"n":' || g || '}', 'UTF8'), 'application/json', 'derived-' || g,
       s.status = 'in_progress' AND g % 2 = 0,
       CASE s.status WHEN 'unknown' THEN now() - interval '1 minute' END,
       CASE WHEN g % 3 = 0 THEN '/v1/charges' END,
       now() - g * interval '2 seconds', now() - g * interval '1 second'
FROM generate_series(1, 4000) AS g,
     LATERAL (SELECT (ARRAY['done', 'failed', 'unknown', 'in_progress'])[1 + g % 4]) AS s(status);
INSERT INTO dedupq_key_audit (tenant, key, action, reason, actor, before)
SELECT 'tenant-' || (g % 7), 'bulk-' || g, 'release', 'stuck ' || g, 'ops', jsonb_build_object('g', g)
FROM generate_series(1, 50) AS g;
"#,
        )
        .await
        .unwrap();
    paid
}

/// Every column of every key row and audit line, as text, in key order
/// (a key row without `uncounted_attempts`, which migration 0007 adds
/// after the ones these tests are about).
async fn snapshot(pool: &PgPool) -> (Vec<String>, Vec<String>) {
    let keys = sqlx::query_scalar(
        "SELECT (to_jsonb(k) - 'uncounted_attempts')::text FROM dedupq_keys k ORDER BY tenant, key",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let audit = sqlx::query_scalar("SELECT a::text FROM dedupq_key_audit a ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    (keys, audit)
}

/// A login role granted what the runtime needs on the tables as they are
/// now (the key table, the audit table, the migrations' record), and nothing on tables created later (no default privileges):
/// only the migration's copy of the grants lets it use the new table.
async fn grant_runtime_role(schema: &str) -> (String, String) {
    let (name, password) = (unique("dq_part_rt"), unique("pw"));
    let pool = admin().await;
    for sql in [
        format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'"),
        format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {name}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON \"{schema}\".dedupq_keys TO {name}"),
        format!("GRANT SELECT, INSERT ON \"{schema}\".dedupq_key_audit TO {name}"),
        format!("GRANT SELECT ON \"{schema}\"._sqlx_migrations TO {name}"),
    ] {
        pool.execute(sql.as_str()).await.unwrap();
    }
    let url = format!("postgres://{name}:{password}@127.0.0.1:5432/postgres");
    (name, url)
}

async fn drop_role(name: &str) {
    let pool = admin().await;
    for sql in [format!("DROP OWNED BY {name}"), format!("DROP ROLE {name}")] {
        pool.execute(sql.as_str()).await.unwrap();
    }
}

/// A new schema at migration 0004, filled (see [`fill`]).
async fn schema_at_0004(schema: &str) -> (Store, Vec<Incoming>) {
    let store = owner_store(schema);
    store
        .pool()
        .execute(format!("CREATE SCHEMA \"{schema}\"").as_str())
        .await
        .unwrap();
    migrator(4, None).await.run(store.pool()).await.unwrap();
    assert_eq!(
        layout(store.pool(), schema).await,
        (None, 0),
        "0004's table"
    );
    // The engine of this build writes the rows, and it needs the column
    // migration 0007 adds; the table of an earlier release had none, so
    // it goes again before the table is migrated.
    let column = |change: &str| {
        format!("ALTER TABLE \"{schema}\".dedupq_keys {change} COLUMN uncounted_attempts")
    };
    let add = column("ADD") + " integer NOT NULL DEFAULT 0";
    store.pool().execute(add.as_str()).await.unwrap();
    let paid = fill(&store).await;
    store.pool().execute(column("DROP").as_str()).await.unwrap();
    (store, paid)
}

#[tokio::test]
async fn partitioning_a_filled_table_keeps_every_key_outcome_and_grant() {
    let schema = unique("parts");
    let (store, paid) = schema_at_0004(&schema).await;
    let (role, role_url) = grant_runtime_role(&schema).await;
    let before = snapshot(store.pool()).await;
    let (ok, out) = migrate_cli(&schema, &["--partitions", "8"]);
    assert!(ok, "{out}");
    let after = snapshot(store.pool()).await;

    assert_eq!(before.0.len(), 4020, "20 payments and 4000 written rows");
    assert_eq!(before.1.len(), 50);
    assert_eq!(after.0.len(), before.0.len(), "every key is kept");
    assert!(
        before == after,
        "every key row and audit line is kept as it was"
    );
    let admin = admin().await;
    assert_eq!(layout(&admin, &schema).await, (Some("h".into()), 8));
    let (missing,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_inherits i, unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE']) p \
         WHERE i.inhparent = to_regclass(format('%I.dedupq_keys', $1::text)) \
           AND NOT has_table_privilege($2, i.inhrelid, p)",
    )
    .bind(&schema)
    .bind(&role)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(missing, 0, "each partition carries the old table's grants");

    // The runtime role claims and finishes on the new table, and a
    // payment finished before the migration is still a duplicate.
    let runtime = Store::connect_lazy(&StoreSettings {
        url: SecretUrl::new(role_url),
        schema: Some(schema.clone()),
        max_connections: 4,
        ..StoreSettings::default()
    })
    .unwrap();
    runtime.check_migrated(Some(&schema)).await.unwrap();
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&runtime, handler.clone(), support::fast_options());
    let new = support::message("acme", "after-migration", r#"{"amount":99}"#);
    let decisions = engine
        .process(&[new.clone(), paid[3].clone()])
        .await
        .unwrap();
    let outcomes: Vec<Outcome> = decisions.iter().map(|d| d.outcome).collect();
    assert_eq!(outcomes, [Outcome::Processed, Outcome::Duplicate]);
    assert_eq!(handler.count(), 1, "only the new payment ran");
    let again = engine.process(&[new]).await.unwrap();
    assert_eq!(
        again[0].outcome,
        Outcome::Duplicate,
        "its finish was stored"
    );
    drop_role(&role).await;
}

/// The comparison above catches a migration that loses rows: the same
/// schema, migrated by a 0005 that partitions the table but forgets to
/// copy the rows, ends with a partitioned table and nothing in it.
#[tokio::test]
async fn a_migration_that_forgets_to_copy_the_rows_is_caught() {
    const COPY: &str = "INSERT INTO dedupq_keys SELECT * FROM dedupq_keys_unpartitioned;";
    let shipped = include_str!("../../../migrations/0005_partitioned_keys.sql");
    assert!(
        shipped.contains(COPY),
        "the shipped migration copies the rows"
    );
    let broken = shipped.replace(COPY, "");

    let schema = unique("parts");
    let (store, _) = schema_at_0004(&schema).await;
    let before = snapshot(store.pool()).await;
    migrator(5, Some(&broken))
        .await
        .run(store.pool())
        .await
        .unwrap();
    let after = snapshot(store.pool()).await;

    assert_eq!(layout(store.pool(), &schema).await, (Some("h".into()), 16));
    assert_eq!(before.0.len(), 4020);
    assert_eq!(after.0.len(), 0, "the broken migration lost every key");
    assert!(
        before != after,
        "the check of the shipped migration would fail"
    );
}
