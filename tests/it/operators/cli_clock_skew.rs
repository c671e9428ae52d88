//! `dedupq keys release|settle` on a host whose clock is off: a lease is
//! live or over by PostgreSQL's clock, never the operator's. A CLI clock
//! 30 s fast once released a live lease without `--force` (audited as a
//! plain release), and a producer retry ran a second execution.

use crate::support::{claim_request, cli, isolated_store, message};
use dedupq::config::StoreSettings;
use dedupq::engine::Parser;
use dedupq::identity::Identity;
use dedupq::store::{ClaimResult, Finish, FinishWrite, Refund, Store};
use std::path::PathBuf;
use std::time::Duration;

const BODY: &str = r#"{"amount":820,"currency":"EUR"}"#;

fn config(store: &StoreSettings) -> PathBuf {
    let text = format!(
        "[store]\nurl = \"{}\"\nschema = \"{}\"\n",
        store.url.expose(),
        store.schema.as_deref().unwrap()
    );
    cli::config_file(&text.parse().unwrap())
}

/// Claims acme/`key` for `owner` with a 20 s lease, as a worker would.
async fn claimed(store: &Store, key: &str, owner: &str) -> (Identity, ClaimResult) {
    let msg = message("acme", key, BODY);
    let parsed = Parser::new(&Default::default()).parse(&msg).unwrap();
    let mut results = store
        .claim_batch(
            &[claim_request(&parsed, &msg)],
            owner,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    (parsed.identity, results.remove(0))
}

async fn audit(store: &Store) -> Vec<(String, String)> {
    sqlx::query_as("SELECT action, reason FROM dedupq_key_audit ORDER BY id")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

/// The whole row, to show that a refused command left it as it was.
async fn row(store: &Store, id: &Identity) -> serde_json::Value {
    serde_json::to_value(store.show_key(id).await.unwrap().unwrap()).unwrap()
}

#[tokio::test]
async fn keys_release_under_a_cli_clock_30s_fast_refuses_a_live_lease_unless_forced() {
    let (store, settings) = isolated_store().await;
    let config = config(&settings);
    let (id, claim) = claimed(&store, "live-1", "worker-1").await;
    assert!(matches!(claim, ClaimResult::Won(_)), "{claim:?}");
    let before = row(&store, &id).await;

    let refused = cli::run_skewed(
        &config,
        "+30s",
        &["keys", "release", "acme", "live-1", "--reason", "INC-7"],
    );
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    for words in ["held by worker-1", "live lease", "--force"] {
        assert!(
            refused.stderr.contains(words),
            "{words}: {}",
            refused.stderr
        );
    }
    assert_eq!(audit(&store).await, [], "a refusal writes no audit line");
    assert_eq!(row(&store, &id).await, before, "nor changes the row");

    let forced = cli::run_skewed(
        &config,
        "+30s",
        &[
            "keys", "release", "acme", "live-1", "--reason", "INC-7", "--force",
        ],
    );
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert_eq!(
        audit(&store).await,
        [("release_forced".to_string(), "INC-7".to_string())]
    );
    let over: bool = sqlx::query_scalar(
        "SELECT lease_until <= now() FROM dedupq_keys WHERE tenant = 'acme' AND key = 'live-1'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(over, "the lease ends at once by PostgreSQL's clock");
}

/// An unknown outcome (more attempts allowed) ends the lease at once; a
/// CLI clock 30 s slow must not see it as live and refuse the settlement.
#[tokio::test]
async fn keys_settle_under_a_cli_clock_30s_slow_settles_an_unknown_key_whose_lease_is_over() {
    let (store, settings) = isolated_store().await;
    let config = config(&settings);
    let (id, claim) = claimed(&store, "unknown-1", "worker-1").await;
    let ClaimResult::Won(claim) = claim else {
        panic!("{claim:?}")
    };
    let unknown = Finish::Unknown {
        error: "provider timed out".into(),
        hold: false,
        refund: Refund::No,
    };
    let landed = store
        .finish_batch(&[FinishWrite {
            identity: &id,
            epoch: claim.epoch,
            finish: unknown,
            at: claim.at,
        }])
        .await
        .unwrap();
    assert_eq!(landed, [dedupq::store::Written::Landed]);

    let settled = cli::run_skewed(
        &config,
        "-30s",
        &[
            "keys",
            "settle",
            "acme",
            "unknown-1",
            "--done",
            "--result",
            r#"{"id":"ch_1"}"#,
            "--reason",
            "INC-8: the provider shows ch_1",
        ],
    );
    assert_eq!(settled.code, 0, "{}", settled.stderr);
    assert_eq!(
        audit(&store).await,
        [(
            "settle_done".to_string(),
            "INC-8: the provider shows ch_1".to_string()
        )]
    );
    assert_eq!(row(&store, &id).await["status"], "done");
}
