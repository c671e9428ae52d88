use crate::support;
use async_trait::async_trait;
use dedupq::config::IdentitySettings;
use dedupq::engine::{
    Action, DeadLetterReason, Outcome, Parser, TransactionalEngine, TransactionalHandler, TxFailure,
};
use dedupq::handler::{HandlerCall, HandlerResult};
use dedupq::metrics::Metrics;
use dedupq::store::{KeyStatus, Store};
use serde_json::json;
use sqlx::PgConnection;
use std::sync::Arc;
use std::time::Duration;

/// Writes an order row in the claim's own transaction.
struct PlaceOrder;

#[async_trait]
impl TransactionalHandler for PlaceOrder {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure> {
        let body: serde_json::Value = call.json().unwrap_or_default();
        let amount = body["amount"].as_i64().unwrap_or(0);
        sqlx::query("INSERT INTO orders (tenant, key, amount) VALUES ($1, $2, $3)")
            .bind(call.identity.tenant.as_str())
            .bind(call.identity.key.as_str())
            .bind(amount)
            .execute(&mut *conn)
            .await
            .map_err(|e| TxFailure::Transient(e.to_string()))?;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if amount < 0 {
            return Err(TxFailure::Permanent(HandlerResult::json(
                422,
                &json!({"error": "negative amount"}),
            )));
        }
        Ok(HandlerResult::json(
            201,
            &json!({"order": call.derived_key}),
        ))
    }
}

async fn setup() -> (Store, TransactionalEngine) {
    let (store, _) = support::isolated_store().await;
    sqlx::query("CREATE TABLE orders (tenant text, key text, amount bigint)")
        .execute(store.pool())
        .await
        .unwrap();
    let engine = TransactionalEngine::new(
        store.clone(),
        Arc::new(PlaceOrder),
        Parser::new(&IdentitySettings::default()),
        support::fast_options(),
        Metrics::new(),
    );
    (store, engine)
}

async fn orders(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_in_same_database_mode_write_one_order() {
    let (store, engine) = setup().await;
    let engine = Arc::new(engine);
    let runs = (0..10).map(|_| {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .process(&[support::message("acme", "order-1", r#"{"amount": 5}"#)])
                .await
                .unwrap()
        })
    });
    let outcomes: Vec<Outcome> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap()[0].outcome)
        .collect();

    assert_eq!(orders(&store).await, 1);
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Outcome::Processed)
            .count(),
        1
    );
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Processed | Outcome::Duplicate)),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn a_permanent_failure_rolls_back_the_work_but_stores_the_failure() {
    let (store, engine) = setup().await;
    let msg = support::message("acme", "order-neg", r#"{"amount": -5}"#);

    let d = engine.process(std::slice::from_ref(&msg)).await.unwrap();

    assert_eq!(d[0].outcome, Outcome::Failed);
    assert_eq!(
        orders(&store).await,
        0,
        "the handler's write was rolled back"
    );
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::Failed);
    assert_eq!(
        engine.process(&[msg]).await.unwrap()[0].outcome,
        Outcome::Duplicate
    );
}

/// Writes an order, then fails (transiently) or hangs as its body says.
struct Flaky;

#[async_trait]
impl TransactionalHandler for Flaky {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure> {
        sqlx::query("INSERT INTO orders (tenant, key, amount) VALUES ($1, $2, 1)")
            .bind(call.identity.tenant.as_str())
            .bind(call.identity.key.as_str())
            .execute(&mut *conn)
            .await
            .map_err(|e| TxFailure::Transient(e.to_string()))?;
        if call.request.body == b"{\"hang\": true}" {
            sqlx::query("SELECT pg_sleep(30)")
                .execute(&mut *conn)
                .await
                .map_err(|e| TxFailure::Transient(e.to_string()))?;
        }
        Err(TxFailure::Transient(format!(
            "ledger busy on attempt {}",
            call.attempt
        )))
    }
}

#[tokio::test]
async fn a_transient_failure_is_retried_up_to_max_attempts_then_dead_lettered_with_the_key_free() {
    let (store, _) = setup().await;
    let options = dedupq::engine::EngineOptions {
        max_attempts: 3,
        handler_timeout: Duration::from_millis(500),
        ..support::fast_options()
    };
    let engine = TransactionalEngine::new(
        store.clone(),
        Arc::new(Flaky),
        Parser::new(&IdentitySettings::default()),
        options,
        Metrics::new(),
    );
    for body in [r#"{"fail": true}"#, r#"{"hang": true}"#] {
        let key = format!("order-{}", body.len());
        let mut msg = support::message("acme", &key, body);
        for retries in 0..2 {
            msg.retries = retries;
            let started = std::time::Instant::now();
            let d = engine.process(std::slice::from_ref(&msg)).await.unwrap();
            assert_eq!(
                d[0].outcome,
                Outcome::Retried,
                "{body}, attempt {}",
                retries + 1
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "a hanging handler is abandoned at handler.timeout"
            );
        }
        msg.retries = 2;
        let d = engine.process(std::slice::from_ref(&msg)).await.unwrap();
        assert_eq!(d[0].outcome, Outcome::Failed, "{body}");
        match &d[0].action {
            Action::DeadLetter { reason, detail } => {
                assert_eq!(*reason, DeadLetterReason::ExhaustedRetries);
                assert!(detail.starts_with("3 attempts failed"), "{detail}");
            }
            other => panic!("the last attempt is dead-lettered, not {other:?}"),
        }
        let parsed = Parser::new(&IdentitySettings::default())
            .parse(&msg)
            .unwrap();
        assert!(
            store.show_key(&parsed.identity).await.unwrap().is_none(),
            "nothing happened, so nothing is stored: a replay runs the work afresh"
        );
    }
    // The abandoned statements roll back once they end; none commits.
    assert_eq!(orders(&store).await, 0);
}

/// A span's name and its parent's.
type Opened = (String, Option<String>);

/// Every span opened, with its parent's name.
#[derive(Clone, Default)]
struct OpenedSpans(Arc<std::sync::Mutex<Vec<Opened>>>);

impl<S> tracing_subscriber::Layer<S> for OpenedSpans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let span = ctx.span(id).expect("a new span is registered");
        let parent = span.parent().map(|p| p.name().to_string());
        self.0
            .lock()
            .unwrap()
            .push((span.name().to_string(), parent));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn same_database_mode_makes_the_batch_message_and_handler_spans() {
    use tracing_subscriber::layer::SubscriberExt;
    let (store, engine) = setup().await;
    let opened = OpenedSpans::default();
    // This subscriber wants the spans an exporter would get.
    dedupq::telemetry::spans::set_exporting(true);
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(opened.clone()));
    // tracing caches whether a span is wanted per call site. While only one
    // dispatcher is registered it asks the default of whichever thread first
    // reaches the site, so a parallel test without a subscriber could have it
    // cached as unwanted here. With a second live dispatcher tracing asks
    // every registered one; rebuilding the cache then settles the sites
    // already reached.
    let _every_dispatcher_asked = tracing::Dispatch::new(tracing_subscriber::registry());
    tracing::callsite::rebuild_interest_cache();

    let d = engine
        .process(&[support::message("acme", "order-t", r#"{"amount": 5}"#)])
        .await
        .unwrap();

    assert_eq!(d[0].outcome, Outcome::Processed);
    assert_eq!(orders(&store).await, 1);
    let spans = opened.0.lock().unwrap().clone();
    let named = |name: &str| spans.iter().filter(|(n, _)| n == name).collect::<Vec<_>>();
    assert_eq!(named("dedupq.batch").len(), 1, "{spans:?}");
    assert_eq!(
        named("dedupq.message"),
        [&(
            "dedupq.message".to_string(),
            Some("dedupq.batch".to_string())
        )],
        "{spans:?}"
    );
    assert_eq!(
        named("dedupq.handler"),
        [&(
            "dedupq.handler".to_string(),
            Some("dedupq.message".to_string())
        )],
        "{spans:?}"
    );
}
