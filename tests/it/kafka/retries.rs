use super::common::{body, produce_payments, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, headers, produce, Running};
use crate::support::{engine, eventually, fast_options, isolated_store, unique};
use dedupq::fingerprint::FingerprintSpec;
use dedupq::handler::HandlerOutcome;
use dedupq::identity::{IdempotencyKey, Identity, Tenant};
use dedupq::store::{ClaimRequest, ClaimResult};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_held_by_a_live_lease_elsewhere_is_waited_for_and_never_committed_past() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("held", 1).await;
    let group = unique("g");
    // Another worker holds the key for 3 s and then dies.
    let identity = Identity {
        tenant: Tenant::parse(TENANT.as_bytes()).unwrap(),
        key: IdempotencyKey::parse(b"held").unwrap(),
    };
    let raw = body(0);
    let fp = FingerprintSpec::default().fingerprint(&dedupq::json::parse(&raw).unwrap(), &raw);
    let derived = identity.derived_key();
    let claimed = store
        .claim_batch(
            &[ClaimRequest {
                identity: &identity,
                fingerprint: &fp,
                body: &raw,
                content_type: None,
                derived_key: &derived,
                route: None,
            }],
            "someone-else",
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert!(matches!(claimed[0], ClaimResult::Won(_)));

    let producer = kafka::producer();
    produce(&producer, &topic, 0, &headers(TENANT, "held"), &body(0)).await;
    produce_payments(&producer, &topic, 1..4).await;
    let handler = Arc::new(Recording::default());
    let running = Running::start(
        kafka::settings(&topic, &group),
        engine(&store, handler.clone(), fast_options()),
    );

    // Until the held key runs (after the lease ends), nothing may be
    // committed past it, however done the later messages are.
    eventually(Duration::from_secs(30), "everything committed", || async {
        // Offsets first: if the held key had not run after they were read,
        // it had not run before either.
        let committed = kafka::committed(&group, &topic, 1).await[0];
        let held_ran = handler.calls().iter().any(|c| c.derived_key == "t1:held");
        if !held_ran {
            assert!(
                committed <= 0,
                "committed {committed} past the held message"
            );
        }
        (held_ran && committed == 4).then_some(())
    })
    .await;
    let calls: Vec<String> = handler.calls().into_iter().map(|c| c.derived_key).collect();
    // Other keys of the batch ran meanwhile; the held key ran once, after
    // the lease ended, and only then did the offset move.
    assert_eq!(calls, ["t1:k1", "t1:k2", "t1:k3", "t1:held"]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transient_failure_is_retried_in_place_before_later_messages_of_its_partition() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("transient", 1).await;
    let group = unique("g");
    let transient = || HandlerOutcome::Transient {
        status: Some(503),
        error: "provider unavailable".into(),
        retry_after: None,
    };
    // The failures are the first message's: the second may run while the
    // first waits for its retry, and must not take one of them.
    let handler = Arc::new(Recording::scripted_for(
        "t1:first",
        vec![transient(), transient()],
    ));
    let producer = kafka::producer();
    produce(&producer, &topic, 0, &headers(TENANT, "first"), &body(1)).await;
    let running = Running::start(
        kafka::settings(&topic, &group),
        engine(&store, handler.clone(), fast_options()),
    );
    // The second message arrives while the first is being retried; it may
    // run (another key), but the offset stays before the first until the
    // first's outcome is stored.
    eventually(Duration::from_secs(30), "first attempt failed", || async {
        (handler.count() >= 1).then_some(())
    })
    .await;
    produce(&producer, &topic, 0, &headers(TENANT, "second"), &body(2)).await;
    let firsts = || {
        handler
            .calls()
            .iter()
            .filter(|c| c.derived_key == "t1:first")
            .count()
    };
    eventually(Duration::from_secs(30), "everything committed", || async {
        let committed = kafka::committed(&group, &topic, 1).await[0];
        if firsts() < 3 {
            assert!(
                committed <= 0,
                "committed {committed} past a message being retried"
            );
        }
        (committed == 2).then_some(())
    })
    .await;
    assert_eq!(firsts(), 3, "two transient failures, then success");
    assert_eq!(handler.count(), 4);
    running.stop().await;
}
