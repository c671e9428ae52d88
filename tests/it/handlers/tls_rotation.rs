//! Rotating the handler's TLS files needs no restart. The provider moves to
//! a certificate of a new CA and accepts only client certificates of that
//! CA; until `handler.ca_file` and `handler.client_identity_file` hold the
//! new ones, a payment cannot reach it: a configuration fault (`tls`), so
//! it waits without using up its attempts, nothing stored or dead-lettered;
//! once they are written, the running `dedupq run` uses them within
//! seconds, charges that payment and the next one, and a SIGHUP neither
//! stops it nor changes anything.

use super::tls_target::{Certs, Target};
use crate::support::process::Dedupq;
use crate::support::{isolated_store, kafka, unique};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const BODY: &[u8] = br#"{"amount": 700, "currency": "EUR"}"#;

/// Waits until `n` payments reached `target`; fails with the log.
async fn reached(target: &Target, dedupq: &Dedupq, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while target.received().len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} payments did not reach the target:\n{}",
            dedupq.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replaces `path` as Kubernetes updates a mounted Secret: the new
/// content appears at once, never half-written.
fn replace(path: &Path, from: &Path) {
    let staged = path.with_extension("new");
    std::fs::copy(from, &staged).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_ca_and_client_certificate_are_used_without_a_restart() {
    let (old, new) = (Certs::make(), Certs::make());
    let target = Target::start_closing(&old).await;
    let dir = std::env::temp_dir().join(unique("dedupq-rotate"));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, identity) = (dir.join("provider-ca.pem"), dir.join("client.pem"));
    replace(&ca, &old.ca);
    replace(&identity, &old.client_identity);

    let (_store, store) = isolated_store().await;
    let (topic, _) = kafka::topics("rotate", 1).await;
    let text = format!(
        "[store]\nurl = \"{url}\"\nschema = \"{schema}\"\nmax_connections = 4\n\
         [engine]\nretry_backoff_min = \"100ms\"\nretry_backoff_max = \"500ms\"\n\
         [kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{brokers}\"\ngroup_id = \"{group}\"\n\
         commit_interval = \"200ms\"\n\
         [retention]\nredelivery_horizon = \"1h\"\n\
         [handler]\nkind = \"http\"\nurl = \"{base}/charges\"\ntimeout = \"5s\"\n\
         retry_for = \"1h\"\nca_file = \"{ca}\"\nclient_identity_file = \"{identity}\"\n",
        url = store.url.expose(),
        schema = store.schema.as_deref().unwrap(),
        brokers = kafka::brokers(),
        group = unique("g"),
        base = target.base,
        ca = ca.display(),
        identity = identity.display(),
    );
    let mut dedupq = Dedupq::launch(&text.parse().unwrap(), &[]);
    dedupq.wait_ready(WAIT).await.expect("dedupq starts");
    let producer = kafka::producer();
    let send = |key: &'static str| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            kafka::produce(&producer, &topic, 0, &kafka::headers("acme", key), BODY).await;
        }
    };
    send("before").await;
    reached(&target, &dedupq, 1).await;

    // The provider rotates: new connections meet the new CA's certificate
    // and must show a client certificate of that CA.
    target.rotate(&new);
    send("during").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        target.received().len(),
        1,
        "nothing reaches the provider with the old certificates"
    );
    assert!(dedupq.alive());
    // A refused handshake is a configuration fault: counted, and the
    // payment waits for the fix instead of using up its attempts.
    assert!(
        dedupq
            .metric("dedupq_handler_faults_total{reason=\"tls\"}")
            .await
            > 0.0,
        "{}",
        dedupq.log_tail()
    );
    assert_eq!(dedupq.metric("dedupq_dead_letters_total").await, 0.0);

    replace(&ca, &new.ca);
    replace(&identity, &new.client_identity);
    reached(&target, &dedupq, 2).await;
    dedupq.signal("-HUP");
    send("after").await;
    reached(&target, &dedupq, 3).await;
    let keys: Vec<String> = target
        .received()
        .iter()
        .flat_map(|r| r.header("idempotency-key").into_iter().map(String::from))
        .collect();
    assert_eq!(keys, ["acme:before", "acme:during", "acme:after"]);
    assert!(dedupq.alive(), "SIGHUP does not stop dedupq");
    let log = dedupq.log();
    assert!(log.contains("handler TLS files changed"), "{log}");
    assert!(dedupq.terminate(WAIT).await.is_some());
}
