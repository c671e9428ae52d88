//! PostgreSQL fails over to read-only, lets none of dedupq's sessions in,
//! runs out of disk, or has its key table locked for writes from psql,
//! while a sync request's charge is on its way: the request is not
//! answered as done nor as failed before its outcome is stored; new
//! requests meanwhile are refused with 503 (409 while they wait for a
//! lock that lets reads through) and Retry-After (nothing run), or, when a claim still finds room
//! on a full disk, run at most once and not answered as stored before
//! they are; once PostgreSQL takes writes again, the retry gets the one
//! stored charge.

use super::harness::{scratch, settings, App};
use crate::support::pg_faults::{
    charged_once_and_stored_whole, RoleFault, StagedFault, StoreFault, LONG_ANSWER,
};
use crate::support::process::Provider;
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "shop-1"}"#;
const OTHER: &str = r#"{"amount": 200, "currency": "EUR", "recipient": "shop-2"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_postgres_turns_read_only_is_stored_afterwards_and_new_ones_get_503(
) {
    charged_during(StoreFault::Role(RoleFault::ReadOnly)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_postgres_refuses_connections_is_stored_afterwards_and_new_ones_get_503(
) {
    charged_during(StoreFault::Role(RoleFault::NoConnections)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_postgres_disk_fills_up_is_stored_whole_afterwards_and_new_ones_run_at_most_once(
) {
    charged_during(StoreFault::DiskFull).await;
}

async fn charged_during(kind: StoreFault) {
    // Answers longer than a page (storing one needs a new page), 1 s after
    // the charge: within the handler's timeout, and well before a lease
    // that no renewal keeps is cut (5 s after the claim with the lease
    // below; the harness's 3 s lease cut it 2 s after the claim, and on a
    // loaded machine the answer could come later than that: 409).
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(1),
        answer_padding: LONG_ANSWER,
        ..Knobs::default()
    })
    .await;
    let (_, store) = isolated_store().await;
    let fault = StagedFault::stage(kind, &store).await;
    let mut s = settings(&fault.store_settings(&store), &provider, &scratch());
    s.engine.lease = Duration::from_secs(6);
    s.handler.timeout = Duration::from_millis(2500);
    s.api.request_timeout = Duration::from_secs(6);
    let app = App::start(s).await;
    app.wait_ready().await;

    let first = {
        let url = app.url("payments");
        tokio::spawn(async move {
            super::harness::client()
                .post(url)
                .bearer_auth(super::harness::ACME_KEY)
                .header("Idempotency-Key", "pay-ro")
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    eventually(Duration::from_secs(10), "the provider charged", || async {
        (provider.stats().await.charges == 1).then_some(())
    })
    .await;
    fault.begin().await;
    let first = first.await.expect("task").expect("an answer");
    assert_eq!(
        first, 504,
        "not answered as stored before it is: still running, retry"
    );
    let new = app.pay("pay-new", OTHER).await;
    if fault.refuses_claims() {
        // A claim that waits for the locked table cannot be told from one
        // that waits for another request's claim of the same key: 409.
        let refused = match kind {
            StoreFault::TableLockedForWrites => 409,
            _ => 503,
        };
        assert_eq!(new.status, refused, "{new:?}");
        assert!(new.retry_after() >= 1);
        assert_eq!(
            provider.stats().await.charges,
            1,
            "nothing run for the new one"
        );
    } else {
        // Claimed on a page with room left, perhaps run, never answered
        // as stored while its outcome is not.
        assert!([503, 504].contains(&new.status), "{new:?}");
        assert!(new.retry_after() >= 1);
        assert!(provider.stats().await.charges <= 2);
    }
    assert_eq!(app.decided("http", "invalid"), 0);

    fault.end().await;
    // The stored charge: the first request's own answer, kept through the
    // fault, replayed.
    let retried = eventually(Duration::from_secs(30), "the stored charge", || async {
        let r = app.pay("pay-ro", BODY).await;
        (200..300).contains(&r.status).then_some(r)
    })
    .await;
    assert!(
        retried.replayed() && retried.status == 201,
        "the stored 201, replayed: {retried:?}"
    );
    let charged = provider.charges_for("acme:pay-ro").await;
    assert_eq!(
        retried.json()["id"],
        format!("ch_{}", charged[0].id),
        "the retry hears the charge made during the fault"
    );
    if fault.refuses_claims() {
        assert_eq!(app.pay("pay-new", OTHER).await.status, 201);
    } else {
        eventually(Duration::from_secs(30), "the new one's charge", || async {
            let r = app.pay("pay-new", OTHER).await;
            (200..300).contains(&r.status).then_some(r)
        })
        .await;
    }
    assert_eq!(provider.stats().await.charges, 2, "one charge each");
    for key in ["pay-ro", "pay-new"] {
        charged_once_and_stored_whole(&app.store, &provider, "acme", key).await;
    }
    app.stop().await;
    fault.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_the_key_table_is_locked_for_writes_from_psql_is_stored_afterwards(
) {
    charged_during(StoreFault::TableLockedForWrites).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_the_key_table_is_locked_exclusively_from_psql_is_stored_afterwards_and_new_ones_get_503(
) {
    charged_during(StoreFault::TableLockedExclusively).await;
}
