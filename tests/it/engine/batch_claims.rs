use crate::support::{self, handlers::Recording};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::engine::Outcome;
use dedupq::store::Store;
use sqlx::Row;
use std::sync::Arc;

/// `(calls, rows)` of statements in `db` whose text contains `needle`.
async fn statement_stats(admin: &sqlx::PgPool, db: &str, needle: &str) -> Vec<(i64, i64)> {
    sqlx::query(
        "SELECT s.calls, s.rows FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
         WHERE d.datname = $1 AND s.query LIKE '%' || $2 || '%' AND s.toplevel",
    )
    .bind(db)
    .bind(needle)
    .fetch_all(admin)
    .await
    .expect("pg_stat_statements is loaded (scripts/services configures it)")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A store in a database of its own, so that its statements can be told
/// apart in `pg_stat_statements`; the admin pool and the database's name.
async fn store_in_own_database(prefix: &str) -> (Store, sqlx::PgPool, String) {
    let admin = sqlx::PgPool::connect(&support::database_url())
        .await
        .unwrap();
    let db = support::unique(prefix);
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&support::database_url()).unwrap();
    url.set_path(&db);
    let settings = StoreSettings {
        url: SecretUrl::new(url.as_str()),
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings).unwrap();
    store.migrate(None).await.unwrap();
    (store, admin, db)
}

async fn drop_database(store: Store, admin: &sqlx::PgPool, db: &str) {
    store.pool().close().await;
    sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .execute(admin)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_batch_of_1000_claims_is_one_statement_and_the_results_are_batched_too() {
    let (store, admin, db) = store_in_own_database("claims").await;

    let handler = Arc::new(Recording::default());
    let mut options = support::fast_options();
    options.max_batch = 1000;
    // A lease the claim of 1000 keys cannot outlast on a busy machine: a
    // call is never started on a lease that may end before it does (the
    // key is given back, `Paused`), and this test is about batching.
    options.lease = std::time::Duration::from_secs(30);
    options.renew_every = std::time::Duration::from_secs(5);
    let engine = support::engine(&store, handler.clone(), options);
    let batch: Vec<_> = (0..1000)
        .map(|i| support::message("acme", &format!("bulk-{i}"), r#"{"amount": 1}"#))
        .collect();
    let decisions = engine.process(&batch).await.unwrap();

    let other: Vec<_> = decisions
        .iter()
        .filter(|d| d.outcome != Outcome::Processed)
        .collect();
    assert!(
        other.is_empty(),
        "{} not processed, e.g. {:?}",
        other.len(),
        &other[..other.len().min(3)]
    );
    assert_eq!(handler.count(), 1000);
    let claims = statement_stats(&admin, &db, "INSERT INTO dedupq_keys AS k").await;
    assert_eq!(
        claims,
        vec![(1, 1000)],
        "one claim statement returned all 1000 rows"
    );
    let finishes = statement_stats(&admin, &db, "UPDATE dedupq_keys AS k SET\n    status").await;
    let (calls, rows) = finishes.first().copied().unwrap_or_default();
    assert_eq!(rows, 1000, "every result stored");
    assert!(
        calls <= 20,
        "results are stored in batches, not one by one ({calls} statements)"
    );
    drop_database(store, &admin, &db).await;
}

/// Callers deciding one message each (an HTTP request, an embedder) share
/// statements, and a statement carries one caller's finish together with
/// other callers' claims: fewer commits than a claim and a finish each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_messages_share_statements_that_claim_and_finish_together() {
    // Callers side by side, each deciding its messages one after another
    // (as HTTP connections do): while one caller's finish waits, others'
    // next claims queue beside it.
    const CALLERS: usize = 20;
    const EACH: usize = 10;
    const N: usize = CALLERS * EACH;
    let (store, admin, db) = store_in_own_database("together").await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for i in 0..EACH {
                    let msg = support::message("acme", &format!("one-{c}-{i}"), r#"{"amount": 1}"#);
                    let decided = engine.process(std::slice::from_ref(&msg)).await.unwrap();
                    outcomes.push(decided[0].outcome);
                }
                outcomes
            })
        })
        .collect();
    for caller in callers {
        let outcomes = caller.await.unwrap();
        assert!(
            outcomes.iter().all(|o| *o == Outcome::Processed),
            "{outcomes:?}"
        );
    }
    assert_eq!(handler.count(), N);
    assert_eq!(support::count_rows(&store).await, N as i64);

    // The statement that claims and finishes: both parts in one text.
    let all = statement_stats(&admin, &db, "INSERT INTO dedupq_keys AS k").await;
    let together = statement_stats(&admin, &db, "by_key AS").await;
    let together: Vec<_> = together.into_iter().filter(|s| all.contains(s)).collect();
    let calls: i64 = together.iter().map(|(calls, _)| calls).sum();
    assert!(calls > 0, "no statement claimed and finished together");
    let statements: i64 = statement_stats(&admin, &db, "dedupq_keys AS k")
        .await
        .iter()
        .map(|(calls, _)| calls)
        .sum();
    assert!(
        statements < N as i64,
        "{N} messages took {statements} claim and finish statements (a pair each would be {})",
        2 * N
    );
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE status = 'done'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(finished, N as i64, "every outcome stored");
    drop_database(store, &admin, &db).await;
}

/// The claim statement tells the keys it did not write from the ones it
/// did with one hash of the written rows, not with a nested loop over both
/// lists (dedupq's sessions turn hash joins off, so an anti join would be
/// one: 250 000 comparisons for a batch of 500). Read from the plans
/// PostgreSQL makes for a batch of 500, the first (custom) and the one a
/// prepared statement settles on (generic).
#[tokio::test]
async fn a_claim_tells_unwritten_keys_apart_with_one_hash_not_a_loop_over_the_batch() {
    let (store, _) = support::isolated_store().await;
    let parser = dedupq::engine::Parser::new(&dedupq::config::IdentitySettings::default());
    let messages: Vec<_> = (0..500)
        .map(|i| support::message("acme", &format!("plan-{i}"), r#"{"amount": 1}"#))
        .collect();
    let parsed: Vec<_> = messages.iter().map(|m| parser.parse(m).unwrap()).collect();
    let requests: Vec<_> = parsed
        .iter()
        .zip(&messages)
        .map(|(p, m)| support::claim_request(p, m))
        .collect();
    for generic in [false, true] {
        let plan = store.explain_claim(&requests, generic).await.unwrap();
        assert!(
            plan.contains("Filter: (NOT (hashed SubPlan"),
            "generic={generic}: the unwritten keys are found through a hash:\n{plan}"
        );
        assert!(
            !plan.contains("Anti Join"),
            "generic={generic}: no anti join over the batch:\n{plan}"
        );
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM dedupq_keys")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 0, "explaining claims nothing");
}
