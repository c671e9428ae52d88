//! `dedupq dlq` reaches the brokers the way `dedupq run` does: RabbitMQ
//! over `amqps://` trusting `amqp.tls_ca_file`, Kafka over SASL_SSL; and it
//! gives up, with an error, on a broker that accepts the connection and
//! never answers.

use crate::support::amqp::{Client, Msg};
use crate::support::endpoints::endpoints;
use crate::support::{cli, eventually, kafka, unique};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn config(text: &str) -> std::path::PathBuf {
    cli::config_file(&text.parse().expect("a TOML configuration"))
}

#[tokio::test]
async fn amqp_dead_letters_are_listed_and_replayed_over_amqps_trusting_the_private_ca() {
    let ep = endpoints();
    let client = Client::connect().await;
    let (work, dlq) = (unique("dqt_work"), unique("dqt_dlq"));
    let channel = client.connection.create_channel().await.unwrap();
    for q in [&work, &dlq] {
        channel
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let letter = Msg::new("acme", "k-tls", "not json {").headers(vec![
        ("dedupq-reason".into(), "not_json".into()),
        ("dedupq-source-queue".into(), work.clone()),
    ]);
    client.publish(&dlq, &letter).await;
    let config = config(&format!(
        "[amqp]\nurl = \"{}\"\ntls_ca_file = \"{}\"\ndead_letter_queue = \"{dlq}\"\n",
        ep.get("AMQPS_URL"),
        ep.ca()
    ));

    let listed = cli::run(&config, &["dlq", "list", "amqp"], &[]).json_lines();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["reason"], "not_json");
    assert_eq!(listed[0]["key"], "k-tls");

    let replayed = cli::run(&config, &["dlq", "replay", "amqp", "--execute"], &[]).json_lines();
    assert_eq!(
        replayed[0]["replay"],
        format!("replayed to {work}").as_str(),
        "{replayed:?}"
    );
    eventually(Duration::from_secs(10), "the letter moved", || async {
        (client.ready(&dlq).await == 0 && client.ready(&work).await == 1).then_some(())
    })
    .await;
    let back = client.drain(&work).await;
    assert_eq!(back[0].body, b"not json {");
    assert_eq!(back[0].header("dedupq-reason"), None, "diagnostics dropped");
    for q in [&work, &dlq] {
        let _ = channel
            .queue_delete(q.as_str().into(), Default::default())
            .await;
    }
}

#[tokio::test]
async fn kafka_dead_letters_are_listed_and_replayed_over_sasl_ssl() {
    let ep = endpoints();
    let (topic, dlq) = kafka::topics("dlqsasl", 1).await;
    let mut headers = kafka::headers("acme", "k-sasl");
    headers.push(("dedupq-reason".into(), b"not_json".to_vec()));
    let producer = kafka::producer();
    kafka::produce(&producer, &dlq, 0, &headers, b"not json {").await;
    let client: Vec<String> = ep
        .kafka_client(&ep.ca())
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\""))
        .collect();
    let config = config(&format!(
        "[kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{}\"\n[kafka.client]\n{}\n[kafka.client_files]\n\"sasl.password\" = \"{}\"\n",
        ep.get("KAFKA_SASL_BROKERS"),
        client.join("\n"),
        ep.get("KAFKA_SASL_PASSWORD_FILE"),
    ));

    let listed = cli::run(&config, &["dlq", "list", "kafka"], &[]).json_lines();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["reason"], "not_json");
    let replayed = cli::run(&config, &["dlq", "replay", "kafka", "--execute"], &[]).json_lines();
    assert!(
        replayed[0]["replay"]
            .as_str()
            .unwrap()
            .starts_with(&format!("replayed to {topic}")),
        "{replayed:?}"
    );
    let records = kafka::read(&topic, 1, 1, Duration::from_secs(20)).await;
    assert_eq!(records.len(), 1);
    assert_eq!(kafka::header_str(&records[0], "idempotency-key"), "k-sasl");
}

/// A port where the kernel completes the TCP handshake and nobody ever
/// answers (nothing accepts; the backlog holds the connection).
fn silent_broker() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a silent port");
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Runs `args` against `config` and returns how long it took to fail.
fn fails_within(config: &std::path::PathBuf, args: &[&str], bound: Duration) -> Duration {
    let started = Instant::now();
    let ran = cli::run_within(config, args, &[], Duration::from_secs(90));
    let took = started.elapsed();
    assert!(
        !ran.stderr.contains("[killed"),
        "`{}` hung:\n{}",
        args.join(" "),
        ran.stderr
    );
    assert_ne!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        took < bound,
        "`{}` took {took:?}:\n{}",
        args.join(" "),
        ran.stderr
    );
    took
}

#[test]
fn dlq_commands_give_up_on_a_rabbitmq_that_accepts_and_never_answers() {
    let (_silent, port) = silent_broker();
    for scheme in ["amqp", "amqps"] {
        let config = config(&format!(
            "[amqp]\nurl = \"{scheme}://guest:guest@127.0.0.1:{port}/%2f\"\nconnect_timeout = \"2s\"\n"
        ));
        for args in [
            &["dlq", "list", "amqp"][..],
            &["dlq", "replay", "amqp", "--execute"],
        ] {
            fails_within(&config, args, Duration::from_secs(15));
        }
    }
}

#[test]
fn dlq_commands_give_up_on_a_kafka_that_accepts_and_never_answers() {
    let (_silent, port) = silent_broker();
    let config = config(&format!(
        "[kafka]\ntopics = [\"payments\"]\nbrokers = \"127.0.0.1:{port}\"\n"
    ));
    for args in [
        &["dlq", "list", "kafka"][..],
        &["dlq", "replay", "kafka", "--execute"],
    ] {
        fails_within(&config, args, Duration::from_secs(40));
    }
}
