//! Rotating a Kafka TLS or SASL file needs no restart. librdkafka reads
//! `ssl.ca.location` and the `sasl.password` file when a client is made, so
//! dedupq restarts its consumer in-process when one changes. Here the CA
//! file is swapped for a CA that signed nothing of the broker's: the
//! restarted consumer cannot connect, /readyz says so, a new payment waits
//! and the process stays up; swapped back, the consumer restarts again and
//! the waiting payment and the next are charged once each.

use crate::support::endpoints::endpoints;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self, eventually, kafka, unique};
use dedupq_provider::Knobs;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Replaces `path` with `from`'s content at once, as a Secret update does.
fn replace(path: &Path, from: &str) {
    let staged = path.with_extension("new");
    std::fs::copy(from, &staged).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_kafka_ca_file_is_used_without_a_restart() {
    let ep = endpoints();
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = support::isolated_store().await;
    let (topic, _) = kafka::topics("kafka_rot", 1).await;
    let dir = std::env::temp_dir().join(unique("dedupq-kafka-rot"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("kafka-ca.pem");
    replace(&ca, &ep.ca());

    let mut config = base_config(&store, &provider);
    let text = format!(
        "topics = [\"{topic}\"]\nbrokers = \"{brokers}\"\ngroup_id = \"{group}\"\n\
         commit_interval = \"200ms\"\nsession_timeout = \"6s\"\n[client_files]\n\
         \"sasl.password\" = \"{password}\"\n",
        brokers = ep.get("KAFKA_SASL_BROKERS"),
        group = unique("g"),
        password = ep.get("KAFKA_SASL_PASSWORD_FILE"),
    );
    let mut section: toml::Table = text.parse().unwrap();
    let client = ep.kafka_client(ca.to_str().unwrap());
    section.insert("client".into(), toml::Value::try_from(client).unwrap());
    config.insert("kafka".into(), toml::Value::Table(section));
    let mut dedupq = Dedupq::launch(&config, &[]);
    dedupq
        .wait_ready(WAIT)
        .await
        .expect("dedupq starts over SASL_SSL");

    let producer = kafka::producer();
    let body = br#"{"amount": 300}"#;
    let charged = |key: &'static str| {
        let provider = &provider;
        eventually(WAIT, "the payment is charged", move || async move {
            (provider.charges_for(&format!("acme:{key}")).await.len() == 1).then_some(())
        })
    };
    kafka::produce(&producer, &topic, 0, &kafka::headers("acme", "r-1"), body).await;
    charged("r-1").await;

    replace(&ca, &ep.other_ca());
    eventually(
        WAIT,
        "not ready with a CA that does not sign the broker",
        || async {
            let (ready, body) = dedupq.readyz().await;
            (!ready && body.contains("kafka")).then_some(())
        },
    )
    .await;
    kafka::produce(&producer, &topic, 0, &kafka::headers("acme", "r-2"), body).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(provider.charges_for("acme:r-2").await.is_empty());
    assert!(dedupq.alive(), "a bad rotated file does not stop dedupq");

    replace(&ca, &ep.ca());
    charged("r-2").await;
    kafka::produce(&producer, &topic, 0, &kafka::headers("acme", "r-3"), body).await;
    charged("r-3").await;
    dedupq.wait_ready(WAIT).await.expect("ready again");
    assert_eq!(provider.stats().await.charges, 3, "each payment once");
    let log = dedupq.log();
    assert!(
        log.contains("Kafka TLS/SASL files changed: restarting the consumer"),
        "{log}"
    );
    assert!(dedupq.terminate(WAIT).await.is_some());
}
