//! `keys release` accepted a live lease: release plus a duplicate gave two
//! concurrent executions. It is refused while the lease is live, saying
//! what `--force` risks; `--force` releases, and both are audited. Against
//! a provider that ignores keys, the forced release shows the risk: the
//! duplicate runs while the first call still does, and charges again; the
//! first worker's lease renewals never bring the released lease back.

use crate::support::payments::{self, WAIT};
use crate::support::process::Provider;
use crate::support::{cli, eventually, http_handler, isolated_store};
use dedupq::engine::{Engine, Outcome};
use dedupq::store::Store;
use dedupq_provider::Knobs;
use std::sync::Arc;
use std::time::Duration;

const BODY: &str = r#"{"amount":820,"currency":"EUR"}"#;

fn engine(store: &Store, provider: &Provider) -> Engine {
    crate::support::engine(
        store,
        Arc::new(http_handler(
            &provider.charges_url(),
            Duration::from_secs(20),
        )),
        crate::support::fast_options(),
    )
}

fn config(store: &dedupq::config::StoreSettings) -> std::path::PathBuf {
    let text = format!(
        "[store]\nurl = \"{}\"\nschema = \"{}\"\n",
        store.url.expose(),
        store.schema.as_deref().unwrap()
    );
    cli::config_file(&text.parse().unwrap())
}

async fn audit(store: &Store) -> Vec<(String, String)> {
    sqlx::query_as("SELECT action, reason FROM dedupq_key_audit ORDER BY id")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_live_lease_is_refused_unless_forced_and_forcing_lets_a_second_execution_run() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(6),
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let (store, settings) = isolated_store().await;
    let config = config(&settings);
    let msg = crate::support::message("acme", "live-1", BODY);
    let first = {
        let (engine, msg) = (engine(&store, &provider), msg.clone());
        tokio::spawn(async move { engine.process(&[msg]).await.unwrap() })
    };
    eventually(WAIT, "the first call charged and runs on", || async {
        (provider.stats().await.charges == 1).then_some(())
    })
    .await;

    let refused = cli::run(
        &config,
        &["keys", "release", "acme", "live-1", "--reason", "INC-5"],
        &[],
    );
    assert_ne!(refused.code, 0);
    for words in ["live lease", "--force", "two executions"] {
        assert!(
            refused.stderr.contains(words),
            "{words}: {}",
            refused.stderr
        );
    }
    assert!(
        !refused.stderr.contains("  "),
        "one readable line: {}",
        refused.stderr
    );
    assert_eq!(audit(&store).await, []);
    let second = engine(&store, &provider);
    let waited = second.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(
        waited[0].outcome,
        Outcome::InFlight,
        "the lease protects it"
    );

    let forced = cli::run(
        &config,
        &[
            "keys",
            "release",
            "acme",
            "live-1",
            "--reason",
            "INC-5: worker looks stuck",
            "--force",
        ],
        &[],
    );
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    // The first worker still runs and renews its leases every 500 ms: the
    // released lease stays over all the same (its epoch has moved on).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = second.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(again[0].outcome, Outcome::Takeover);
    assert_eq!(
        provider.stats().await.charges,
        2,
        "two executions at once: charged twice by a provider ignoring keys"
    );
    let late = first.await.unwrap();
    assert_eq!(
        late[0].outcome,
        Outcome::LeaseLost,
        "the first write is fenced"
    );
    assert_eq!(
        audit(&store).await,
        [(
            "release_forced".to_string(),
            "INC-5: worker looks stuck".to_string()
        )]
    );
    let row = payments::row(&store, "live-1").await.unwrap();
    assert_eq!(row.epoch, 3, "claimed, released, taken over");
}
