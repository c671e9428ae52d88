//! The schema is ready to be distributed (docs/scale-out.md): Citus, like
//! any PostgreSQL that shards by one column, enforces a unique index or a
//! foreign key only inside one shard, and co-locates tables only on the
//! same column type and collation. Read off the catalog after `migrate`:
//! every unique index (primary keys included) of every dedupq table holds
//! `tenant`, the distribution column, and `key`, the alternative one (a
//! single huge tenant spread by its keys' hash); every dedupq table has
//! both, typed and collated as the key table's; no foreign key crosses
//! them. And every per-key statement of the hot path finds the rows it
//! reads or writes by `tenant` and `key` equality with its input, the
//! condition a shard-by-shard join needs.
//!
//! Each check is shown failing on a broken variant: an audit table keyed
//! by `id` alone (as migrations 0001–0005 left it, before 0006), a unique
//! index on one partition, a table without the column, another collation,
//! a foreign key that swaps the columns, and a finish that finds its rows
//! by key alone.

use crate::support;
use serde_json::Value;
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;
use sqlx::{Executor, PgPool, Row};
use std::path::Path;

/// The distribution column docs/scale-out.md chooses.
const DISTRIBUTION: &str = "tenant";
/// The one it names for a tenant too large for one shard.
const ALTERNATIVE: &str = "key";
/// Every column a distribution can use: each check applies to both.
const COLUMNS: [&str; 2] = [DISTRIBUTION, ALTERNATIVE];

/// dedupq's tables (partitions included) in `schema`. `_sqlx_migrations`
/// is not one: only `dedupq migrate` touches it, and it stays a table of
/// the coordinator.
const TABLES: &str = "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname <> '_sqlx_migrations'";

/// What would stop the tables of `schema` from being distributed by
/// `tenant` (or `key`) and co-located; empty when nothing would.
async fn distribution_problems(pool: &PgPool, schema: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for column in COLUMNS {
        problems.extend(missing_columns(pool, schema, column).await);
        problems.extend(unique_without(pool, schema, column).await);
        problems.extend(crossing_foreign_keys(pool, schema, column).await);
    }
    problems
}

/// Tables without `column`, or with another type or collation than the
/// key table's (co-located tables must match both).
async fn missing_columns(pool: &PgPool, schema: &str, column: &str) -> Vec<String> {
    let sql = format!(
        "WITH t AS ({TABLES}), \
         col AS (SELECT a.attrelid, format_type(a.atttypid, a.atttypmod) AS type, \
                        coalesce(co.collname, '') AS collation \
                 FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation \
                 WHERE a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped), \
         keys AS (SELECT col.* FROM col \
                  WHERE col.attrelid = to_regclass(format('%I.dedupq_keys', $1::text))) \
         SELECT CASE WHEN col.attrelid IS NULL \
                     THEN format('table %s has no column %s', t.oid::regclass, $2) \
                     ELSE format('table %s: %s is %s collate %s, the key table''s is %s collate %s', \
                                 t.oid::regclass, $2, col.type, col.collation, \
                                 keys.type, keys.collation) END \
         FROM t LEFT JOIN col ON col.attrelid = t.oid, keys \
         WHERE (col.attrelid IS NULL) OR (col.type, col.collation) <> (keys.type, keys.collation)"
    );
    problems(pool, &sql, schema, column).await
}

/// Unique and exclusion indexes (primary keys and unique constraints are
/// among them) whose key columns do not include `column`.
async fn unique_without(pool: &PgPool, schema: &str, column: &str) -> Vec<String> {
    let sql = format!(
        "SELECT format('unique index %s of %s does not hold %s', \
                       i.indexrelid::regclass, i.indrelid::regclass, $2) \
         FROM pg_index i \
         WHERE i.indrelid IN ({TABLES}) AND (i.indisunique OR i.indisexclusion) \
           AND NOT EXISTS ( \
               SELECT 1 FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) \
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
               WHERE k.n <= i.indnkeyatts AND a.attname = $2) \
         ORDER BY 1"
    );
    problems(pool, &sql, schema, column).await
}

/// Foreign keys of dedupq tables that do not pair `column` with `column`
/// (or point outside dedupq's tables): no shard could check them alone.
/// Those PostgreSQL copies onto each partition are left out: they are
/// the declared key's, judged with it.
async fn crossing_foreign_keys(pool: &PgPool, schema: &str, column: &str) -> Vec<String> {
    let sql = format!(
        "WITH t AS ({TABLES}), \
         pairs AS ( \
             SELECT c.oid, c.conname, c.conrelid, c.confrelid, \
                    (SELECT attname FROM pg_attribute WHERE attrelid = c.conrelid AND attnum = p.own) AS own, \
                    (SELECT attname FROM pg_attribute WHERE attrelid = c.confrelid AND attnum = p.other) AS other \
             FROM pg_constraint c, unnest(c.conkey, c.confkey) AS p(own, other) \
             WHERE c.contype = 'f' AND c.conparentid = 0 AND c.conrelid IN (SELECT oid FROM t)) \
         SELECT format('foreign key %s of %s crosses the distribution by %s', \
                       conname, conrelid::regclass, $2) \
         FROM pairs \
         GROUP BY oid, conname, conrelid, confrelid \
         HAVING confrelid NOT IN (SELECT oid FROM t) \
             OR NOT bool_or((own = $2) AND (other = $2)) \
             OR bool_or((own = $2) <> (other = $2)) \
         ORDER BY 1"
    );
    problems(pool, &sql, schema, column).await
}

#[tokio::test]
async fn every_unique_index_of_a_migrated_schema_holds_the_distribution_column() {
    let (store, settings) = support::isolated_store().await;
    let schema = settings.schema.unwrap();
    // The store's pool: its search_path is the schema, so names print bare.
    let pool = store.pool();
    let tables: Vec<String> =
        sqlx::query_scalar(&format!("SELECT oid::regclass::text FROM ({TABLES}) t"))
            .bind(&schema)
            .fetch_all(pool)
            .await
            .unwrap();
    // Not vacuous: the key table, its 16 partitions and the audit table.
    assert_eq!(tables.len(), 18, "{tables:?}");
    let problems = distribution_problems(pool, &schema).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test]
async fn an_index_table_or_foreign_key_that_would_not_distribute_is_caught() {
    let (store, settings) = support::isolated_store().await;
    let schema = settings.schema.unwrap();
    let pool = store.pool();
    for sql in [
        // The audit table as migrations 0001 to 0005 left it.
        "ALTER TABLE dedupq_key_audit DROP CONSTRAINT dedupq_key_audit_pkey, \
         ADD CONSTRAINT dedupq_key_audit_pkey PRIMARY KEY (id)",
        // Unique within one partition, by key alone.
        "CREATE UNIQUE INDEX dedupq_keys_p0000_by_key ON dedupq_keys_p0000 (key)",
        // A table that could not be co-located: no tenant at all, and
        // one whose tenant compares under another collation.
        "CREATE TABLE dedupq_notes (id bigint PRIMARY KEY, key text COLLATE \"C\")",
        "CREATE TABLE dedupq_tags (tenant text, key text COLLATE \"C\", PRIMARY KEY (tenant, key))",
        // Each audit line's key read as the tenant, and the reverse.
        "ALTER TABLE dedupq_key_audit ADD CONSTRAINT dedupq_key_audit_swapped \
         FOREIGN KEY (key, tenant) REFERENCES dedupq_keys (tenant, key)",
    ] {
        pool.execute(sql).await.unwrap();
    }
    let problems = distribution_problems(pool, &schema).await;
    let text = problems.join("\n");
    for expected in [
        "unique index dedupq_key_audit_pkey of dedupq_key_audit does not hold tenant",
        "unique index dedupq_key_audit_pkey of dedupq_key_audit does not hold key",
        "unique index dedupq_keys_p0000_by_key of dedupq_keys_p0000 does not hold tenant",
        "table dedupq_notes has no column tenant",
        "unique index dedupq_notes_pkey of dedupq_notes does not hold tenant",
        "table dedupq_tags: tenant is text collate default, the key table's is text collate C",
        "foreign key dedupq_key_audit_swapped of dedupq_key_audit crosses the distribution by tenant",
        "foreign key dedupq_key_audit_swapped of dedupq_key_audit crosses the distribution by key",
    ] {
        assert!(text.contains(expected), "missed `{expected}` in:\n{text}");
    }
    // A foreign key that pairs each column with itself is co-located.
    pool.execute(
        "ALTER TABLE dedupq_key_audit DROP CONSTRAINT dedupq_key_audit_swapped, \
         ADD CONSTRAINT dedupq_key_audit_paired \
         FOREIGN KEY (tenant, key) REFERENCES dedupq_keys (tenant, key)",
    )
    .await
    .unwrap();
    let problems = distribution_problems(pool, &schema).await;
    assert!(
        !problems
            .iter()
            .any(|p| p.contains("dedupq_key_audit_paired")),
        "{problems:?}"
    );
}

/// A string constant of `src/store/<file>.rs`, as the compiler reads it:
/// `r#"…"#` as written, `"…"` with its `\` line continuations.
fn store_sql(file: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/store/{file}.rs"));
    let source = std::fs::read_to_string(&path).unwrap();
    let start = source
        .find(&format!("const {name}: &str ="))
        .unwrap_or_else(|| panic!("no const {name} in {}", path.display()));
    literal_after(&source[start..])
}

/// The first string literal of `text`.
fn literal_after(text: &str) -> String {
    let raw = text.find("r#\"");
    let plain = text.find('"');
    match (raw, plain) {
        (Some(r), Some(p)) if r < p => {
            let body = &text[r + 3..];
            body[..body.find("\"#").unwrap()].to_string()
        }
        (_, Some(p)) => {
            let mut out = String::new();
            let mut chars = text[p + 1..].chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '"' => return out,
                    '\\' => match chars.next() {
                        Some('\n') => {
                            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                                chars.next();
                            }
                        }
                        Some('n') => out.push('\n'),
                        Some(other) => out.push(other),
                        None => break,
                    },
                    c => out.push(c),
                }
            }
            panic!("unterminated string literal")
        }
        _ => panic!("no string literal"),
    }
}

/// A batch statement as the product sends it (the finish with its epoch
/// fence).
fn product_sql(name: &str) -> String {
    dedupq::store::statement_sql(name)
        .unwrap_or_else(|| panic!("no statement {name}"))
        .to_string()
}

type Q<'q> = Query<'q, Postgres, PgArguments>;
/// Binds a statement's input.
type Binds = fn(Q<'_>) -> Q<'_>;

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// One tenant's keys, as every batch statement takes them.
fn tenants() -> Vec<String> {
    texts(&["acme", "acme", "acme"])
}
fn keys() -> Vec<String> {
    texts(&["k-1", "k-2", "k-3"])
}
fn bytes() -> Vec<Vec<u8>> {
    vec![vec![1u8; 32]; 3]
}

/// The per-key statements of the hot path (claims, finishes, renewals,
/// the lock probe; same-database mode; the HTTP API's lookup), each with
/// a single-tenant input bound.
fn hot_statements() -> Vec<(&'static str, String, Binds)> {
    vec![
        ("claim", product_sql("claim"), claim_binds),
        ("finish", product_sql("finish"), finish_binds),
        ("claim and finish", product_sql("claim and finish"), |q| {
            finish_binds(claim_binds(q))
        }),
        ("renew", store_sql("maintenance", "RENEW_SQL"), |q| {
            q.bind(tenants())
                .bind(keys())
                .bind(vec![1i64; 3])
                .bind(30.0f64)
        }),
        ("locked rows", store_sql("locks", "LOCKED_SQL"), |q| {
            q.bind(tenants()).bind(keys())
        }),
        (
            "claim in transaction",
            store_sql("transactional", "TX_CLAIM_SQL"),
            |q| {
                q.bind("acme")
                    .bind("k-1")
                    .bind(vec![1u8; 32])
                    .bind(2i16)
                    .bind("worker")
                    .bind(vec![1u8; 8])
                    .bind("application/json")
                    .bind("acme:k-1")
                    .bind(None::<String>)
            },
        ),
        (
            "read one",
            store_sql("transactional", "READ_ONE_SQL"),
            |q| q.bind("acme").bind("k-1"),
        ),
        (
            "finish in transaction",
            store_sql("transactional", "TX_FINISH_SQL"),
            |q| {
                q.bind("acme")
                    .bind("k-1")
                    .bind("done")
                    .bind(200i32)
                    .bind(vec![1u8; 8])
                    .bind("application/json")
            },
        ),
        ("lookup", store_sql("lookup", "LOOKUP_SQL"), |q| {
            q.bind("acme").bind("k-1")
        }),
    ]
}

fn claim_binds(q: Q<'_>) -> Q<'_> {
    q.bind(tenants())
        .bind(keys())
        .bind(bytes())
        .bind(vec![2i16; 3])
        .bind(bytes())
        .bind(vec![Some("application/json"); 3])
        .bind(texts(&["acme:k-1", "acme:k-2", "acme:k-3"]))
        .bind(30.0f64)
        .bind("worker")
        .bind(vec![None::<Vec<u8>>; 3])
        .bind(vec![None::<String>; 3])
}

/// A finish's input; in a statement shared with a claim, the other keys
/// of the same tenant.
fn finish_binds(q: Q<'_>) -> Q<'_> {
    q.bind(tenants())
        .bind(texts(&["k-4", "k-5", "k-6"]))
        .bind(vec![1i64; 3])
        .bind(texts(&["done", "done", "done"]))
        .bind(vec![Some(200i32); 3])
        .bind(vec![Some(vec![1u8; 8]); 3])
        .bind(vec![Some("application/json"); 3])
        .bind(vec![None::<String>; 3])
        .bind(vec![false; 3])
        .bind(vec![0i32; 3])
        .bind(vec![Some(16_384i64); 3])
        .bind(vec![Some("(0,1)"); 3])
}

/// How `sql` reaches the key table, planned with a single-tenant input:
/// every scan of it (or of a partition) must be an index scan whose
/// condition is `tenant = …` and `key = …`, and an insert's conflict
/// arbiter the primary key. Joins other than nested loops and
/// sequential scans are turned off, so that a plan reads the table
/// through the rows' identities whenever the statement allows it; one
/// that does not names its identities only partly, or not at all.
async fn reach_problems(pool: &PgPool, name: &str, sql: &str, bind: Binds) -> Vec<String> {
    let mut tx = pool.begin().await.unwrap();
    tx.execute(
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
         SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off",
    )
    .await
    .unwrap();
    let explain = format!("EXPLAIN (FORMAT JSON) {sql}");
    let row = bind(sqlx::query(&explain))
        .fetch_one(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let plan: sqlx::types::Json<Value> = row.get(0);
    tx.rollback().await.unwrap();
    let mut problems = Vec::new();
    let mut reached = 0;
    walk(&plan.0[0]["Plan"], &mut |node| {
        let relation = node["Relation Name"].as_str().unwrap_or("");
        if !relation.starts_with("dedupq_keys") {
            return;
        }
        if let Some(arbiters) = node["Conflict Arbiter Indexes"].as_array() {
            reached += 1;
            if arbiters.iter().any(|a| a != "dedupq_keys_pkey") {
                problems.push(format!("{name}: conflict arbiters {arbiters:?}"));
            }
        }
        let kind = node["Node Type"].as_str().unwrap_or("");
        if !kind.ends_with("Scan") {
            return;
        }
        reached += 1;
        // An index scan finds the row by its identity; a TID scan (a
        // finish at the place its claim wrote) reads one place and keeps
        // the row only if its identity matches the input's.
        let (cond, by_identity) = match kind {
            "Tid Scan" => {
                let filter = node["Filter"].as_str().unwrap_or("");
                let by = |c: &str| filter.contains(&format!("= {c})"));
                (filter, COLUMNS.iter().all(|c| by(c)))
            }
            _ => {
                let cond = node["Index Cond"].as_str().unwrap_or("");
                let by = |c: &str| cond.contains(&format!("({c} = "));
                (
                    cond,
                    kind.starts_with("Index") && COLUMNS.iter().all(|c| by(c)),
                )
            }
        };
        if !by_identity {
            problems.push(format!("{name}: {kind} on {relation} ({cond})"));
        }
    });
    if reached == 0 {
        problems.push(format!("{name}: the plan never reaches dedupq_keys"));
    }
    problems
}

fn walk(node: &Value, visit: &mut impl FnMut(&Value)) {
    visit(node);
    for child in node["Plans"].as_array().into_iter().flatten() {
        walk(child, visit);
    }
}

#[tokio::test]
async fn every_hot_path_statement_finds_its_rows_by_tenant_and_key() {
    let (store, _) = support::isolated_store().await;
    let mut problems = Vec::new();
    for (name, sql, bind) in hot_statements() {
        problems.extend(reach_problems(store.pool(), name, &sql, bind).await);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test]
async fn a_statement_that_finds_its_rows_by_key_alone_is_caught() {
    let (store, _) = support::isolated_store().await;
    let shipped = product_sql("finish");
    let by_key = shipped.replace("k.tenant = u.tenant AND ", "");
    assert_ne!(by_key, shipped, "the shipped finish matches on the tenant");
    let problems = reach_problems(store.pool(), "finish by key", &by_key, finish_binds).await;
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("finish by key: ") && !p.contains("(tenant = ")),
        "{problems:?}"
    );
}

/// Runs a catalog query over (`schema`, `column`) whose rows are problems.
async fn problems(pool: &PgPool, sql: &str, schema: &str, column: &str) -> Vec<String> {
    sqlx::query_scalar(sql)
        .bind(schema)
        .bind(column)
        .fetch_all(pool)
        .await
        .unwrap()
}
