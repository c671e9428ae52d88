//! Provider answers PostgreSQL's `jsonb` could never hold (a `\u0000`
//! escape; a raw NUL and bytes that are not UTF-8) are stored exactly as
//! the provider sent them, in one finish with their batch-mates, and
//! nothing runs twice. An answer as long as `handler.max_response_bytes`
//! is stored whole; one byte longer, the key settles with the provider's
//! status and no body.

use crate::support::{self, process::Provider};
use async_trait::async_trait;
use dedupq::engine::Outcome;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HttpHandler};
use dedupq::store::Store;
use dedupq_provider::{Knobs, OddAnswer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The http handler, counting its calls.
struct Counting(HttpHandler, AtomicUsize);

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.handle(call).await
    }
}

async fn stored(store: &Store, key: &str) -> (String, Vec<u8>) {
    sqlx::query_as("SELECT status, result_body FROM dedupq_keys WHERE key = $1")
        .bind(key)
        .fetch_one(store.pool())
        .await
        .expect("the key's row")
}

async fn odd_answer_lands_byte_for_byte(kind: OddAnswer, marker: &[u8]) {
    let provider = Provider::start(Knobs {
        odd_answer: Some(kind),
        odd_answer_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Counting(
        support::http_handler(&provider.charges_url(), Duration::from_secs(10)),
        AtomicUsize::new(0),
    ));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let keys = ["odd-a", "odd-b", "odd-c"];
    let batch: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(n, k)| support::message("acme", k, &format!(r#"{{"amount": {n}}}"#)))
        .collect();

    let first = engine.process(&batch).await.expect("the batch is decided");
    assert!(
        first.iter().all(|d| d.outcome == Outcome::Processed),
        "{first:?}"
    );
    let again = engine.process(&batch).await.expect("the batch is decided");
    assert!(
        again.iter().all(|d| d.outcome == Outcome::Duplicate),
        "{again:?}"
    );
    assert_eq!(handler.1.load(Ordering::SeqCst), 3, "each ran once");

    let mut odd = 0;
    for key in keys {
        let (status, body) = stored(&store, key).await;
        assert_eq!(status, "done", "{key}");
        let answer = provider.lookup(&format!("acme:{key}")).await;
        let sent = answer.bytes().await.expect("lookup body").to_vec();
        assert_eq!(
            body, sent,
            "{key}: stored exactly what the provider answered"
        );
        if body.windows(marker.len()).any(|w| w == marker) {
            odd += 1;
        }
    }
    assert_eq!(odd, 1, "one answer in the batch was the odd one");
    assert_eq!(provider.stats().await.charges, 3);
}

#[tokio::test]
async fn an_answer_with_a_nul_escape_is_stored_done_byte_for_byte_with_its_batch_mates() {
    odd_answer_lands_byte_for_byte(OddAnswer::NulEscape, br"\u0000").await;
}

#[tokio::test]
async fn an_answer_with_raw_nul_and_non_utf8_bytes_is_stored_done_byte_for_byte_with_its_batch_mates(
) {
    odd_answer_lands_byte_for_byte(OddAnswer::RawBytes, b"\x00").await;
}

/// The key's status, the provider's status and the stored body.
async fn stored_result(store: &Store, key: &str) -> (String, Option<i32>, Vec<u8>) {
    sqlx::query_as(
        "SELECT status, result_status, coalesce(result_body, '') FROM dedupq_keys WHERE key = $1",
    )
    .bind(key)
    .fetch_one(store.pool())
    .await
    .expect("the key's row")
}

/// Decides one payment of `key` in a schema of its own, with a handler
/// that reads at most `limit` bytes of an answer.
async fn decided_with_limit(
    provider: &Provider,
    key: &str,
    limit: usize,
) -> (String, Option<i32>, Vec<u8>) {
    let (store, _) = support::isolated_store().await;
    let handler = dedupq::handler::HttpHandler::new(&dedupq::config::HandlerSettings {
        url: provider.charges_url(),
        timeout: Duration::from_secs(10),
        max_response_bytes: limit,
        ..Default::default()
    })
    .expect("valid handler settings");
    let engine = support::engine(&store, Arc::new(handler), support::fast_options());
    let batch = [support::message("acme", key, r#"{"amount": 700}"#)];
    let decided = engine
        .process(&batch)
        .await
        .expect("the payment is decided");
    assert_eq!(decided[0].outcome, Outcome::Processed, "{decided:?}");
    stored_result(&store, key).await
}

#[tokio::test]
async fn an_answer_at_the_size_limit_is_stored_whole_and_one_byte_past_it_settles_with_its_status_alone(
) {
    let provider = Provider::start(Knobs::default()).await;
    let key = format!("sized-{}", support::unique("k"));
    // The provider answers a repeat of a derived key with its first
    // answer's body (and 200): every schema after the first gets the same
    // answer, byte for byte.
    let (first, ..) = decided_with_limit(&provider, &key, 1024 * 1024).await;
    assert_eq!(first, "done");
    let (status, code, answer) = decided_with_limit(&provider, &key, 1024 * 1024).await;
    assert_eq!(status, "done");
    assert!(answer.len() > 1, "a charge answer has a body");

    let at = decided_with_limit(&provider, &key, answer.len()).await;
    assert_eq!(
        at,
        (status.clone(), code, answer.clone()),
        "at the limit: stored whole"
    );

    let past = decided_with_limit(&provider, &key, answer.len() - 1).await;
    assert_eq!(
        past,
        (status, code, Vec::new()),
        "one byte past the limit: done with the provider's status, its body not stored"
    );
    assert_eq!(
        provider.stats().await.charges,
        1,
        "one charge, answered four times"
    );
}
