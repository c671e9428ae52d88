//! Same-database mode behind Kafka (`examples/ledger.rs`), SIGKILLed
//! mid-stream: every payment's ledger row exists exactly once. The test
//! binary re-runs itself as the ledger process (`LEDGER_CHILD`), so the
//! process that is killed runs exactly the example's code.

#[path = "../../../examples/ledger.rs"]
#[allow(dead_code)]
mod example;

use crate::support;
use crate::support::kafka::{self, headers, produce};
use async_trait::async_trait;
use dedupq::config::Settings;
use dedupq::engine::{TransactionalHandler, TxFailure};
use dedupq::handler::{HandlerCall, HandlerResult};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// The config file the child reads; set only in the child process.
const CHILD: &str = "LEDGER_CHILD";
/// Set in the child to book outside the claim's transaction (the broken
/// variant the test must catch).
const OUTSIDE: &str = "LEDGER_OUTSIDE_TX";

/// Books on a connection of its own, committed at once, then lingers: a
/// kill in between leaves the booking without the key's result.
struct BooksOutsideTheTransaction(sqlx::PgPool);

#[async_trait]
impl TransactionalHandler for BooksOutsideTheTransaction {
    async fn handle(
        &self,
        _conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure> {
        let amount = call
            .json::<serde_json::Value>()
            .ok()
            .and_then(|v| v["amount"].as_i64())
            .unwrap_or(0);
        sqlx::query("INSERT INTO ledger (tenant, key, amount) VALUES ($1, $2, $3)")
            .bind(call.identity.tenant.as_str())
            .bind(call.identity.key.as_str())
            .bind(amount)
            .execute(&self.0)
            .await
            .map_err(|e| TxFailure::Transient(e.to_string()))?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(HandlerResult::json(
            201,
            &serde_json::json!({ "amount": amount }),
        ))
    }
}

/// The child: runs the ledger application until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_child_process() {
    let Ok(file) = std::env::var(CHILD) else {
        return; // only in the re-run child
    };
    let settings = Settings::load(Some(Path::new(&file))).expect("child config");
    dedupq::telemetry::init(&settings.log);
    let handler: Arc<dyn TransactionalHandler> = if std::env::var(OUTSIDE).is_ok() {
        // The key table's schema, on connections of their own.
        let store = dedupq::store::Store::connect_lazy(&settings.store).expect("store settings");
        Arc::new(BooksOutsideTheTransaction(store.pool().clone()))
    } else {
        Arc::new(example::Ledger)
    };
    example::run(settings, handler).await.expect("ledger runs");
}

struct Ledger {
    config: std::path::PathBuf,
    outside: bool,
    child: Option<Child>,
}

impl Ledger {
    fn start(config: &std::path::Path, outside: bool) -> Self {
        let mut me = Self {
            config: config.to_path_buf(),
            outside,
            child: None,
        };
        me.spawn();
        me
    }

    fn spawn(&mut self) {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args(["--exact", "ledger::ledger_child_process", "--nocapture"])
            .env(CHILD, &self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.outside {
            command.env(OUTSIDE, "1");
        }
        self.child = Some(command.spawn().expect("spawn the ledger child"));
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Produces `payments` payments, each 1–3 times, runs the ledger with
/// SIGKILLs mid-stream until every offset is committed, and returns the
/// number of ledger rows per key.
async fn run_with_kills(payments: usize, outside: bool) -> (BTreeMap<String, i64>, usize) {
    let (_, store) = support::isolated_store().await;
    let schema = store.schema.clone().unwrap();
    let (topic, _) = kafka::topics("ledger", 2).await;
    let group = support::unique("ledger_group");
    let dir = std::env::temp_dir().join(support::unique("ledger"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("ledger.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
url = "{url}"
schema = "{schema}"

[kafka]
topics = ["{topic}"]
brokers = "{brokers}"
group_id = "{group}"
commit_interval = "200ms"
# A killed member's partitions move on after this (the broker's minimum).
session_timeout = "6s"

[http]
listen = "127.0.0.1:0"

[log]
filter = "warn"
"#,
            url = store.url.expose(),
            brokers = kafka::brokers(),
        ),
    )
    .unwrap();

    let producer = kafka::producer();
    let mut sent = 0;
    for i in 0..payments {
        let key = format!("pay-{i}");
        let body = format!(r#"{{"amount": {}}}"#, 100 + i);
        for _ in 0..(1 + i % 3) {
            produce(
                &producer,
                &topic,
                (i % 2) as i32,
                &headers("acme", &key),
                body.as_bytes(),
            )
            .await;
            sent += 1;
        }
    }
    let pool = dedupq::store::Store::connect_lazy(&store).unwrap();
    let booked = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ledger")
            .fetch_one(pool.pool())
            .await
            .unwrap_or(0)
    };
    let mut ledger = Ledger::start(&config, outside);
    // Kill while bookings are being made: each time a few more landed.
    for round in 1..=4 {
        let target = (round * payments / 6) as i64;
        support::eventually(Duration::from_secs(60), "bookings in progress", || async {
            (booked().await >= target).then_some(())
        })
        .await;
        ledger.kill();
        ledger.spawn();
    }
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(120)).await;
    ledger.kill();

    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT key, count(*) FROM ledger GROUP BY key")
        .fetch_all(pool.pool())
        .await
        .expect("the ledger table exists");
    (rows.into_iter().collect(), sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_mid_stream_every_ledger_row_exists_exactly_once() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let payments = 400;
    let (rows, sent) = run_with_kills(payments, false).await;
    assert!(sent > payments, "the stream carried duplicates");
    let twice: Vec<_> = rows.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "booked more than once: {twice:?}");
    assert_eq!(rows.len(), payments, "every payment booked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn booking_outside_the_claims_transaction_is_caught_booking_twice() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let (rows, _) = run_with_kills(400, true).await;
    let twice = rows.values().filter(|n| **n > 1).count();
    assert!(
        twice > 0,
        "a handler that commits its own writes must show repeated bookings after kills"
    );
}
