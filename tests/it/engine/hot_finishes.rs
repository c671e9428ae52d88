use crate::support::{self, handlers::Recording};
use async_trait::async_trait;
use dedupq::config::{IdentitySettings, SecretUrl, StoreSettings};
use dedupq::engine::{Outcome, Parser};
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use dedupq::store::{KeyFilter, KeyStatus, Store};
use std::sync::Arc;
use std::time::Duration;

/// A store on a fresh schema with a single connection, so the statistics
/// of every statement the engine ran can be flushed from the test.
async fn single_connection_store() -> Store {
    let schema = support::unique("hot");
    let settings = StoreSettings {
        url: SecretUrl::new(support::database_url()),
        schema: Some(schema.clone()),
        max_connections: 1,
        // As in the rest of the suite: the finishes cross partitions.
        partitions: 16,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings).unwrap();
    store.migrate(Some(&schema)).await.unwrap();
    store
}

/// `(updates, HOT updates)` of the key table, summed over its partitions
/// (where its rows are), once PostgreSQL counted `expected` updates.
async fn updates(store: &Store, expected: i64) -> (i64, i64) {
    support::eventually(Duration::from_secs(15), "update statistics", || async {
        // The pool's only connection ran every statement: flush its counts.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(store.pool())
            .await
            .unwrap();
        let (parts, upd, hot): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), coalesce(sum(s.n_tup_upd), 0)::int8, \
                    coalesce(sum(s.n_tup_hot_upd), 0)::int8 \
             FROM pg_stat_user_tables s JOIN pg_inherits i ON i.inhrelid = s.relid \
             WHERE i.inhparent = 'dedupq_keys'::regclass",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(parts, 16, "the key table's partitions");
        (upd >= expected).then_some((upd, hot))
    })
    .await
}

/// Answers like a provider acknowledging a charge: a short body, so the
/// finished row is about as long as the claimed one (a much longer answer
/// needs more room on the page than the fill factor leaves).
struct Acknowledging;

#[async_trait]
impl Handler for Acknowledging {
    async fn handle(&self, _: &HandlerCall<'_>) -> HandlerOutcome {
        HandlerOutcome::Success(HandlerResult::json(
            201,
            &serde_json::json!({"charged": true}),
        ))
    }
}

async fn process_new_keys(store: &Store, n: usize) {
    let engine = support::engine(store, Arc::new(Acknowledging), support::fast_options());
    let batch: Vec<_> = (0..n)
        .map(|i| {
            let body = format!(
                r#"{{"amount": {i}, "currency": "EUR", "recipient": "acct-{i}", "purpose": "invoice {i}"}}"#
            );
            support::message("acme", &format!("hot-{i}"), &body)
        })
        .collect();
    let decisions = engine.process(&batch).await.unwrap();
    assert!(decisions.iter().all(|d| d.outcome == Outcome::Processed));
}

#[tokio::test]
async fn finishing_a_batch_of_new_keys_writes_no_index_entry() {
    let store = single_connection_store().await;
    process_new_keys(&store, 300).await;
    let (upd, hot) = updates(&store, 300).await;
    assert_eq!(upd, 300, "one finish per key");
    assert_eq!(hot, upd, "every finish is a HOT update");
}

/// The check above can fail: an index on a column every finish changes
/// (as the partial indexes on `status` of earlier releases did) makes
/// every finish write index entries again.
#[tokio::test]
async fn an_index_on_the_status_would_make_every_finish_write_index_entries() {
    let store = single_connection_store().await;
    sqlx::query(
        "CREATE INDEX open_keys ON dedupq_keys (lease_until) \
         WHERE status IN ('in_progress', 'unknown')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    process_new_keys(&store, 300).await;
    let (upd, hot) = updates(&store, 300).await;
    assert_eq!(upd, 300);
    assert_eq!(hot, 0, "no finish can be HOT");
}

fn unknown() -> HandlerOutcome {
    HandlerOutcome::Unknown {
        error: "timed out after sending".into(),
    }
}

#[tokio::test]
async fn an_unknown_outcome_marks_the_key_uncertain_until_a_settling_answer() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::scripted(vec![unknown()]));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let msg = support::message("acme", "maybe", r#"{"amount": 1}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    let marked = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT uncertain_since IS NOT NULL FROM dedupq_keys WHERE key = 'maybe'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap()
    };

    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(first[0].outcome, Outcome::Unknown);
    assert!(marked().await);
    assert_eq!(
        store.count_unknown().await.unwrap(),
        vec![(KeyStatus::Unknown, 1)]
    );
    let listed = store
        .list_keys(KeyFilter::Status(KeyStatus::Unknown), Some("acme"), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, parsed.identity.key.as_str());

    let second = engine.process(&[msg]).await.unwrap();
    assert_eq!(second[0].outcome, Outcome::Takeover);
    assert!(handler.calls()[1].uncertain, "the retry knows it is one");
    assert!(!marked().await, "a stored answer settles the key");
    assert_eq!(
        store.count_unknown().await.unwrap(),
        vec![(KeyStatus::Unknown, 0)]
    );
}

/// A worker that died mid-call left its attempt open: the takeover may
/// repeat an effect, so the key is uncertain from then on.
#[tokio::test]
async fn taking_over_an_attempt_that_never_ended_marks_the_key_uncertain() {
    let (store, _) = support::isolated_store().await;
    let msg = support::message("acme", "died", r#"{"amount": 2}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    store
        .claim_batch(
            &[support::claim_request(&parsed, &msg)],
            "dead-worker",
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    let handler = Arc::new(Recording::scripted(vec![unknown()]));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let taken = support::eventually(Duration::from_secs(10), "takeover", || async {
        let d = engine.process(std::slice::from_ref(&msg)).await.unwrap();
        (d[0].outcome != Outcome::InFlight).then(|| d[0].clone())
    })
    .await;
    assert_eq!(taken.outcome, Outcome::Unknown);
    assert!(handler.calls()[0].uncertain);
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::Unknown);
    assert_eq!(
        store.count_unknown().await.unwrap(),
        vec![(KeyStatus::Unknown, 1)]
    );
}

/// The unknown gauge counts through the index of uncertain keys; the table
/// refuses an unknown key that would not be in it.
#[tokio::test]
async fn an_unknown_key_without_the_uncertain_mark_is_refused() {
    let (store, _) = support::isolated_store().await;
    let insert = |uncertain: &'static str| {
        let sql = format!(
            "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, \
             epoch, owner, attempts, uncertain_since) \
             VALUES ('acme', 'k-{uncertain}', '\\x00', 2, 'unknown', 1, 'w', 1, {uncertain})"
        );
        let pool = store.pool().clone();
        async move { sqlx::query(&sql).execute(&pool).await }
    };
    let refused = insert("NULL").await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("dedupq_keys_unknown_is_uncertain"),
        "{refused}"
    );
    insert("now()").await.unwrap();
    assert_eq!(
        store.count_unknown().await.unwrap(),
        vec![(KeyStatus::Unknown, 1)]
    );
}
