//! A finish reaches its row where the claim wrote it (`Claim::at`), and the
//! hint never decides which row is written: a row that moved is found by
//! its key, a stale owner's hint is fenced, and a hint that points at
//! another key's row writes neither row wrongly. Finishes of fewer than
//! `HINTED_FROM` rows go through the primary key alone, so each case
//! finishes at least that many rows at once.

use crate::support;
use dedupq::config::{IdentitySettings, SecretUrl, StoreSettings};
use dedupq::engine::Parser;
use dedupq::identity::Identity;
use dedupq::store::{
    Answer, Claim, ClaimResult, Finish, FinishWrite, KeyStatus, Store, Written, HINTED_FROM,
};
use std::time::Duration;

/// A store on a fresh schema with one connection, so that the index
/// statistics of its statements can be flushed from the test.
async fn single_connection_store() -> Store {
    let schema = support::unique("hint");
    let settings = StoreSettings {
        url: SecretUrl::new(support::database_url()),
        schema: Some(schema.clone()),
        max_connections: 1,
        partitions: 16,
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&settings).unwrap();
    store.migrate(Some(&schema)).await.unwrap();
    store
}

/// Index entries read from the key table's primary key so far, over its partitions,
/// once every statement before this call is counted.
async fn primary_key_reads(store: &Store) -> i64 {
    let read = || async {
        // The pool's only connection ran every statement: its counts go
        // out at the end of this one.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(store.pool())
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(s.idx_tup_read), 0)::int8 \
             FROM pg_stat_user_indexes s JOIN pg_inherits i ON i.inhrelid = s.relid \
             JOIN pg_index x ON x.indexrelid = s.indexrelid \
             WHERE i.inhparent = 'dedupq_keys'::regclass AND x.indisprimary",
        )
        .fetch_one(store.pool())
        .await
        .unwrap()
    };
    let mut last = read().await;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = read().await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Claims fresh keys `names` of tenant `acme`; their identities and claims.
async fn claim(
    store: &Store,
    names: &[impl AsRef<str>],
    lease: Duration,
) -> Vec<(Identity, Claim)> {
    let parser = Parser::new(&IdentitySettings::default());
    let msgs: Vec<_> = names
        .iter()
        .map(|k| support::message("acme", k.as_ref(), r#"{"amount": 5}"#))
        .collect();
    let parsed: Vec<_> = msgs.iter().map(|m| parser.parse(m).unwrap()).collect();
    let requests: Vec<_> = parsed
        .iter()
        .zip(&msgs)
        .map(|(p, m)| support::claim_request(p, m))
        .collect();
    let results = store
        .claim_batch(&requests, "worker-a", lease)
        .await
        .unwrap();
    parsed
        .into_iter()
        .zip(results)
        .map(|(p, r)| match r {
            ClaimResult::Won(c) => (p.identity, c),
            other => panic!("a fresh key is won: {other:?}"),
        })
        .collect()
}

/// `n` key names starting with `prefix`.
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A finish of `id` (at `epoch`, hinted at `at`) first, then the `others`
/// as their claims left them: a batch large enough to go through the
/// rows' places.
fn batch_with<'a>(
    others: &'a [(Identity, Claim)],
    id: &'a Identity,
    epoch: dedupq::identity::Epoch,
    at: Option<dedupq::store::RowAt>,
    body: &str,
) -> Vec<FinishWrite<'a>> {
    let first = FinishWrite {
        identity: id,
        epoch,
        finish: done(body),
        at,
    };
    std::iter::once(first)
        .chain(others.iter().map(|(id, c)| FinishWrite {
            identity: id,
            epoch: c.epoch,
            finish: done(r#"{"other":true}"#),
            at: c.at,
        }))
        .collect()
}

fn done(body: &str) -> Finish {
    Finish::Done(Answer {
        status: 201,
        body: body.as_bytes().to_vec(),
        content_type: Some("application/json".into()),
    })
}

async fn stored_body(store: &Store, id: &Identity) -> Option<String> {
    let row = store.show_key(id).await.unwrap().unwrap();
    let state = store.lookup(id).await.unwrap().unwrap();
    (row.status == KeyStatus::Done).then(|| String::from_utf8(state.result.unwrap().body).unwrap())
}

/// Finishes `claims` in one statement, with their hints or without;
/// returns how many primary-key entries it read.
async fn finish_counting_reads(store: &Store, claims: &[(Identity, Claim)], hinted: bool) -> i64 {
    let before = primary_key_reads(store).await;
    let writes: Vec<FinishWrite<'_>> = claims
        .iter()
        .map(|(id, c)| FinishWrite {
            identity: id,
            epoch: c.epoch,
            finish: done(r#"{"charged":true}"#),
            at: if hinted { c.at } else { None },
        })
        .collect();
    let written = store.finish_batch(&writes).await.unwrap();
    assert!(written.iter().all(|w| *w == Written::Landed), "{written:?}");
    primary_key_reads(store).await - before
}

#[tokio::test]
async fn a_finish_reaches_its_row_where_the_claim_wrote_it_without_the_primary_key() {
    const N: usize = 100;
    let store = single_connection_store().await;
    let claims = claim(&store, &names("pay", 2 * N), Duration::from_secs(30)).await;
    assert!(claims.iter().all(|(_, c)| c.at.is_some()));

    // Planning a statement also reads each partition's index (the same
    // for both finishes), so the two are compared with each other: the
    // one without places reads at least one more entry per row.
    let hinted = finish_counting_reads(&store, &claims[..N], true).await;
    let bare = finish_counting_reads(&store, &claims[N..], false).await;
    assert!(
        bare - hinted >= N as i64,
        "{N} finishes read {hinted} primary-key entries with their rows' places, {bare} without"
    );
    for (id, _) in &claims {
        assert_eq!(
            stored_body(&store, id).await.as_deref(),
            Some(r#"{"charged":true}"#)
        );
    }
}

#[tokio::test]
async fn a_row_moved_by_a_renewal_is_found_by_its_key() {
    let (store, _) = support::isolated_store().await;
    let names = names("moved", HINTED_FROM);
    let claims = claim(&store, &names, Duration::from_secs(30)).await;
    // Each renewal writes a new version of the row elsewhere on its page.
    for _ in 0..3 {
        let renew: Vec<_> = claims.iter().map(|(id, c)| (id, c.epoch)).collect();
        store
            .renew_leases(&renew, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let writes: Vec<FinishWrite<'_>> = claims
        .iter()
        .map(|(id, c)| FinishWrite {
            identity: id,
            epoch: c.epoch,
            finish: done(r#"{"late":"but mine"}"#),
            at: c.at,
        })
        .collect();
    let written = store.finish_batch(&writes).await.unwrap();
    assert_eq!(written, vec![Written::Landed; HINTED_FROM]);
    for (id, _) in &claims {
        assert_eq!(
            stored_body(&store, id).await.as_deref(),
            Some(r#"{"late":"but mine"}"#)
        );
    }
}

#[tokio::test]
async fn a_stale_owners_hint_is_fenced_after_a_takeover() {
    let (store, _) = support::isolated_store().await;
    let stale = claim(&store, &["taken"], Duration::from_secs(1)).await;
    let (id, old) = &stale[0];
    let others = claim(
        &store,
        &names("kept", HINTED_FROM - 1),
        Duration::from_secs(30),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let new = claim_again(&store, "taken").await;
    assert_eq!(new.epoch.0, 2, "taken over after the lease");

    // The stale owner finishes its batch: the taken-over key among others
    // that are still its own.
    let late = store
        .finish_batch(&batch_with(
            &others,
            id,
            old.epoch,
            old.at,
            r#"{"stale":true}"#,
        ))
        .await
        .unwrap();
    assert_eq!(late[0], Written::Fenced, "a stale epoch must not land");
    assert!(late[1..].iter().all(|w| *w == Written::Landed), "{late:?}");
    // The new owner's own write, through its own hint, lands.
    let mine = store
        .finish_batch(&batch_with(
            &others,
            id,
            new.epoch,
            new.at,
            r#"{"owner":2}"#,
        ))
        .await
        .unwrap();
    assert_eq!(mine[0], Written::Landed);
    assert_eq!(
        stored_body(&store, id).await.as_deref(),
        Some(r#"{"owner":2}"#)
    );
}

/// Claims `key` once more (a takeover once its lease is over).
async fn claim_again(store: &Store, key: &str) -> Claim {
    let msg = support::message("acme", key, r#"{"amount": 5}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    let request = support::claim_request(&parsed, &msg);
    match store
        .claim_batch(&[request], "worker-b", Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0)
    {
        ClaimResult::TakenOver(c) => c,
        other => panic!("taken over: {other:?}"),
    }
}

#[tokio::test]
async fn a_hint_that_points_at_another_keys_row_writes_only_the_named_key() {
    let (store, _) = support::isolated_store().await;
    let claims = claim(
        &store,
        &names("other", HINTED_FROM),
        Duration::from_secs(30),
    )
    .await;
    // Each write carries the next row's place.
    let writes: Vec<FinishWrite<'_>> = claims
        .iter()
        .enumerate()
        .map(|(i, (id, c))| FinishWrite {
            identity: id,
            epoch: c.epoch,
            finish: done(&format!(r#"{{"for":{i}}}"#)),
            at: claims[(i + 1) % claims.len()].1.at,
        })
        .collect();
    let written = store.finish_batch(&writes).await.unwrap();
    assert_eq!(written, vec![Written::Landed; HINTED_FROM]);
    for (i, (id, _)) in claims.iter().enumerate() {
        assert_eq!(
            stored_body(&store, id).await.as_deref(),
            Some(format!(r#"{{"for":{i}}}"#).as_str())
        );
    }
}
