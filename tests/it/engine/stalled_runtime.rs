//! A worker whose runtime stalls (a blocking call on its only thread, as a
//! stop-the-world pause would) while claimed calls wait in line behind the
//! one under way, for longer than their lease. Another worker takes the
//! queued keys over meanwhile. When the stalled runtime runs again it
//! starts none of the queued calls: their leases, by its own clock, ended
//! while it stood still, and PostgreSQL gave the keys to someone else.
//!
//! This is the engine's own check before a call. The worker-process tests
//! (`dependencies::paused_worker`) stop a whole `dedupq run`, where a
//! Kafka worker also loses its partition; here nothing else stops the
//! calls, so the test fails when the check is left out.

use crate::support::{self, handlers::Recording};
use async_trait::async_trait;
use dedupq::engine::Outcome;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use dedupq::store::Store;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Records each call's key; the first call stands still, blocking its
/// thread, until the test lets it go.
struct Freezing {
    keys: Mutex<Vec<String>>,
    frozen: Mutex<Option<mpsc::Sender<()>>>,
    thaw: Mutex<Option<mpsc::Receiver<()>>>,
}

#[async_trait]
impl Handler for Freezing {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        self.keys
            .lock()
            .unwrap()
            .push(call.identity.key.as_str().to_string());
        let frozen = self.frozen.lock().unwrap().take();
        if let Some(frozen) = frozen {
            let thaw = self.thaw.lock().unwrap().take().expect("one thaw");
            frozen.send(()).expect("the test waits");
            // Nothing of this worker's runtime runs now: no renewal, no
            // other call.
            thaw.recv().expect("the test thaws it");
        }
        HandlerOutcome::Success(HandlerResult::json(201, &serde_json::json!({"ok": true})))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_runtime_stalls_past_its_lease_starts_none_of_its_queued_calls() {
    const N: usize = 6;
    let (store, settings) = support::isolated_store().await;
    let mut options = support::fast_options();
    // One call at a time: the rest of the batch waits, claimed, in line.
    options.concurrency = 1;
    let messages: Vec<_> = (0..N)
        .map(|k| {
            support::message(
                "acme",
                &format!("pay-{k}"),
                &format!(r#"{{"amount": {k}}}"#),
            )
        })
        .collect();
    let (frozen_tx, frozen_rx) = mpsc::channel();
    let (thaw_tx, thaw_rx) = mpsc::channel();
    let handler = Arc::new(Freezing {
        keys: Mutex::new(Vec::new()),
        frozen: Mutex::new(Some(frozen_tx)),
        thaw: Mutex::new(Some(thaw_rx)),
    });

    // The worker on a runtime of its own, with one thread.
    let worker = std::thread::spawn({
        let (handler, options, messages) = (handler.clone(), options.clone(), messages.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let store = Store::connect_lazy(&settings).expect("a pool");
                let engine = support::engine(&store, handler, options);
                engine
                    .process(&messages)
                    .await
                    .expect("decisions")
                    .into_iter()
                    .map(|d| d.outcome)
                    .collect::<Vec<_>>()
            })
        }
    });
    tokio::task::spawn_blocking(move || frozen_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .expect("join")
        .expect("the first call under way");

    // Past the queued keys' leases as PostgreSQL keeps them.
    support::eventually(
        Duration::from_secs(20),
        "the queued leases ended",
        || async {
            let ended: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM dedupq_keys WHERE key <> 'pay-0' AND status = 'in_progress' \
             AND lease_until < now()",
            )
            .fetch_one(store.pool())
            .await
            .expect("count");
            (ended == N as i64 - 1).then_some(())
        },
    )
    .await;
    // Another worker takes them over and settles them.
    let rival = Arc::new(Recording::default());
    let mut rival_options = options;
    rival_options.owner = support::unique("rival");
    let taken = support::engine(&store, rival.clone(), rival_options)
        .process(&messages[1..])
        .await
        .expect("the rival's decisions");
    assert!(
        taken.iter().all(|d| d.outcome == Outcome::Takeover),
        "{:?}",
        taken.iter().map(|d| d.outcome).collect::<Vec<_>>()
    );

    thaw_tx.send(()).expect("the worker waits");
    let outcomes = tokio::task::spawn_blocking(move || worker.join())
        .await
        .expect("join")
        .expect("the worker's thread");
    assert_eq!(
        *handler.keys.lock().unwrap(),
        ["pay-0"],
        "the stalled worker started no call it had queued"
    );
    assert!(
        outcomes[1..].iter().all(|o| *o == Outcome::LeaseLost),
        "{outcomes:?}"
    );
    assert_eq!(
        rival.count(),
        N - 1,
        "each queued key run once, by the rival"
    );
}
