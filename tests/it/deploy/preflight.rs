//! `dedupq check`, the preflight an operator runs before the first start:
//! against the real PostgreSQL, Kafka (stock retention), RabbitMQ and the
//! provider simulator. A deployment ready to run passes every check and
//! charges nothing; each missing piece fails its own check, with the fix.

use crate::support::cli::{config_file, run};
use crate::support::endpoints::endpoints;
use crate::support::pg_faults::FaultyRole;
use crate::support::process::Provider;
use crate::support::{amqp, database_url, isolated_store, kafka, unique};
use dedupq::cli::{checks, Report, Status};
use dedupq::config::{Keep, QueueType, SecretUrl, Settings, StoreSettings, Topology};
use dedupq_provider::Knobs;
use sqlx::{Executor, PgPool};
use std::time::Duration;

/// Kafka's own defaults, set on the topic so the test broker's shorter
/// ones do not apply: 7 days of retention, a segment rolled weekly.
const STOCK: &[(&str, &str)] = &[("retention.ms", "604800000"), ("segment.ms", "604800000")];

/// A source topic and its dead-letter topic as an operator creates them on
/// a broker with stock settings (no auto-create: both made by hand).
async fn stock_topics(prefix: &str) -> String {
    let topic = unique(prefix);
    kafka::create_topic_with(&topic, 2, STOCK).await;
    kafka::create_topic_with(&format!("{topic}.dlq"), 1, STOCK).await;
    topic
}

/// Settings of a deployment on these services: `store`, Kafka `topic`,
/// a RabbitMQ queue, the provider.
fn settings(store: &StoreSettings, topic: &str, provider: &Provider) -> Settings {
    let mut s = Settings {
        store: store.clone(),
        ..Settings::default()
    };
    s.kafka = kafka::settings(topic, &unique("g"));
    s.amqp = amqp::settings(QueueType::Classic);
    s.handler.url = provider.charges_url();
    s
}

fn status(report: &Report, name: &str) -> Status {
    report
        .get(name)
        .unwrap_or_else(|| panic!("no check {name}: {report:#?}"))
        .status
}

fn assert_fails(report: &Report, name: &str, words: &[&str]) {
    let check = report
        .get(name)
        .unwrap_or_else(|| panic!("no check {name}: {report:#?}"));
    assert_eq!(check.status, Status::Fail, "{check:#?}");
    let fix = check.fix.as_deref().expect("a failed check says the fix");
    let text = format!("{} {fix}", check.detail);
    for w in words {
        assert!(text.contains(w), "{w:?} missing from {check:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_ready_to_run_passes_every_check_and_charges_nothing() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let topic = stock_topics("pre_ok").await;
    let s = settings(&store, &topic, &provider);
    dedupq::transport::amqp::prepare_topology(&s.amqp)
        .await
        .expect("queues declared");
    let config = config_file(&toml::Table::try_from(&s).expect("settings as TOML"));

    let ran = run(&config, &["check", "--output", "json"], &[]);
    let report: serde_json::Value = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", ran.stdout, ran.stderr));
    let checks = report["checks"].as_array().expect("a list of checks");
    let not_ok: Vec<_> = checks.iter().filter(|c| c["status"] != "ok").collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    assert_eq!((ran.code, &report["ok"]), (0, &serde_json::json!(true)));
    let names: Vec<&str> = checks.iter().filter_map(|c| c["check"].as_str()).collect();
    for expected in [
        "config",
        "store.connect",
        "store.writable",
        "store.migrations",
        "store.privileges",
        "kafka.connect",
        &format!("kafka.topic {topic}"),
        &format!("kafka.topic {topic}.dlq"),
        "retention.keep",
        "amqp.connect",
        "amqp.topology",
        &format!("handler.url {}", provider.charges_url()),
    ] {
        assert!(
            names.contains(&expected),
            "{expected} not checked: {names:?}"
        );
    }
    // The stock topic's replay: 7 d retention + 7 d segment roll + the
    // broker's check interval; "auto" keeps keys that long.
    let keep = checks
        .iter()
        .find(|c| c["check"] == "retention.keep")
        .unwrap();
    assert!(
        keep["detail"].as_str().unwrap().contains("14days"),
        "{keep}"
    );

    let text = run(&config, &["check"], &[]);
    assert_eq!(text.code, 0, "{}\n{}", text.stdout, text.stderr);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        checks.len() + 1,
        "one line per check and a total"
    );
    assert!(lines
        .iter()
        .take(checks.len())
        .all(|l| l.starts_with("ok  ")));
    assert_eq!(
        provider.stats().await.charges,
        0,
        "a preflight charges nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_missing_piece_fails_its_own_check_and_names_the_fix() {
    let provider = Provider::start(Knobs::default()).await;
    // A schema nothing has migrated, with a runtime that only checks.
    let mut store = StoreSettings {
        url: SecretUrl::new(database_url()),
        schema: Some(unique("pre_empty")),
        ..StoreSettings::default()
    };
    store.migrate = dedupq::config::MigrateMode::Check;
    // A source topic without its dead-letter topic, another not there.
    let topic = unique("pre_nodlq");
    kafka::create_topic_with(&topic, 1, STOCK).await;
    let absent = unique("pre_absent");
    let mut s = settings(&store, &topic, &provider);
    s.kafka.topics.push(absent.clone());
    s.amqp.topology = Topology::Verify;
    s.handler.url = format!("http://127.0.0.1:{}/charges", closed_port());
    s.handler.ca_file = Some("/nonexistent/provider-ca.pem".into());

    let report = checks(Ok(s.clone())).await;
    assert_fails(
        &report,
        "store.migrations",
        &["pending: 0001 keys", "dedupq migrate"],
    );
    assert_fails(
        &report,
        &format!("kafka.topic {absent}"),
        &["does not exist", "create it"],
    );
    assert_fails(
        &report,
        &format!("kafka.topic {topic}.dlq"),
        &["does not exist", "kafka.create_topics = true"],
    );
    assert_eq!(status(&report, &format!("kafka.topic {topic}")), Status::Ok);
    assert_fails(
        &report,
        "amqp.topology",
        &["missing", "amqp.topology = \"declare\""],
    );
    assert_fails(
        &report,
        "file handler.ca_file",
        &["/nonexistent/provider-ca.pem"],
    );
    assert!(report.failed());

    // With what dedupq run would do itself allowed, those are warnings.
    s.kafka.create_topics = true;
    s.amqp.topology = Topology::Declare;
    s.kafka.topics.retain(|t| *t != absent);
    s.handler.ca_file = None;
    let report = checks(Ok(s.clone())).await;
    assert_eq!(
        status(&report, &format!("kafka.topic {topic}.dlq")),
        Status::Warn
    );
    assert_eq!(status(&report, "amqp.topology"), Status::Warn);
    // The provider is still not there.
    assert_fails(
        &report,
        &format!("handler.url {}", s.handler.url),
        &["unreachable", "Connection refused"],
    );

    // The real binary says the same, one line per check, and exits 1.
    let config = config_file(&toml::Table::try_from(&s).expect("settings as TOML"));
    let ran = run(&config, &["check"], &[]);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout
            .lines()
            .any(|l| l.starts_with("fail  store.migrations") && l.contains("fix: ")),
        "{}",
        ran.stdout
    );
    assert_eq!(provider.stats().await.charges, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_and_a_role_without_grants_fail_the_store_checks() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let topic = stock_topics("pre_ro").await;
    let faulty = FaultyRole::create().await;
    faulty.fail_over_to_read_only().await;
    let s = settings(&faulty.store_settings(&store), &topic, &provider);
    let report = checks(Ok(s)).await;
    assert_fails(
        &report,
        "store.writable",
        &["transaction_read_only is on", "primary"],
    );
    faulty.drop().await;

    // A login role with USAGE on the schema and no grant on its tables.
    let admin = PgPool::connect(&database_url()).await.unwrap();
    let (role, password) = (unique("dq_nogrant"), unique("pw"));
    let schema = store.schema.clone().unwrap();
    for sql in [
        format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
        format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {role}"),
        format!("GRANT SELECT ON \"{schema}\"._sqlx_migrations TO {role}"),
        format!("GRANT SELECT ON \"{schema}\".dedupq_keys TO {role}"),
    ] {
        admin.execute(sql.as_str()).await.unwrap();
    }
    let url = format!("postgres://{role}:{password}@127.0.0.1:5432/postgres");
    let s = settings(
        &StoreSettings {
            url: SecretUrl::new(url),
            ..store.clone()
        },
        &topic,
        &provider,
    );
    let report = checks(Ok(s)).await;
    assert_fails(
        &report,
        "store.privileges",
        &[
            &role,
            "INSERT on dedupq_keys",
            "DELETE on dedupq_keys",
            "GRANT",
        ],
    );
    assert_eq!(status(&report, "store.migrations"), Status::Ok);
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        admin.execute(sql.as_str()).await.unwrap();
    }
}

/// A role whose `CONNECTION LIMIT` leaves less room than the process
/// opens (its pool and the upkeep connection) would meet `too many
/// connections` (53300) under load: the check warns, naming the role, the
/// limit and the `ALTER ROLE` that makes room; with room, it passes; with
/// none at all, connecting fails with PostgreSQL's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_connection_limit_below_what_the_process_opens_warns_with_the_fix() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let topic = stock_topics("pre_connlimit").await;
    let admin = PgPool::connect(&database_url()).await.unwrap();
    let (role, password) = (unique("dq_connlimit"), unique("pw"));
    admin
        .execute(
            format!("CREATE ROLE {role} LOGIN PASSWORD '{password}' CONNECTION LIMIT 6").as_str(),
        )
        .await
        .unwrap();
    let url = format!("postgres://{role}:{password}@127.0.0.1:5432/postgres");
    let with_pool = |max_connections: u32| {
        settings(
            &StoreSettings {
                url: SecretUrl::new(url.clone()),
                max_connections,
                ..store.clone()
            },
            &topic,
            &provider,
        )
    };

    let report = checks(Ok(with_pool(8))).await;
    let check = report.get("store.connections").expect("the check ran");
    assert_eq!(check.status, Status::Warn, "{check:#?}");
    let text = format!("{} {}", check.detail, check.fix.as_deref().unwrap_or(""));
    for w in [
        role.as_str(),
        "CONNECTION LIMIT 6",
        "up to 9",
        &format!("ALTER ROLE {role} CONNECTION LIMIT 9"),
    ] {
        assert!(text.contains(w), "{w:?} missing from {check:#?}");
    }

    // Room for a pool of 5 and the upkeep connection.
    let report = checks(Ok(with_pool(5))).await;
    assert_eq!(status(&report, "store.connections"), Status::Ok);

    // No room at all: the connect check fails with PostgreSQL's reason,
    // not the pool's timeout.
    admin
        .execute(format!("ALTER ROLE {role} CONNECTION LIMIT 0").as_str())
        .await
        .unwrap();
    let report = checks(Ok(with_pool(5))).await;
    assert_fails(
        &report,
        "store.connect",
        &["too many connections", "53300", "CONNECTION LIMIT"],
    );
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        admin.execute(sql.as_str()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_refused_connections_fail_their_connect_checks() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let topic = stock_topics("pre_auth").await;
    let ep = endpoints();
    let dir = std::env::temp_dir().join(unique("dedupq-pre"));
    std::fs::create_dir_all(&dir).unwrap();
    let wrong = dir.join("kafka-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();

    let mut s = settings(&store, &topic, &provider);
    s.store.url = SecretUrl::new(format!(
        "postgres://postgres:postgres@127.0.0.1:{}/postgres",
        closed_port()
    ));
    s.kafka.brokers = ep.get("KAFKA_SASL_BROKERS");
    s.kafka.client = ep.kafka_client(&ep.ca());
    s.kafka.client_files = [("sasl.password".to_string(), wrong)].into();
    s.amqp.url = SecretUrl::new(amqp::amqp_url().replace("guest:guest", "guest:wrong"));
    let report = checks(Ok(s)).await;
    assert_fails(
        &report,
        "store.connect",
        &["cannot reach PostgreSQL", "store.url"],
    );
    assert_fails(&report, "kafka.connect", &["SASL_SSL", "kafka.client"]);
    assert_fails(&report, "amqp.connect", &["amqp.url"]);
    assert!(
        report.get("store.migrations").is_none(),
        "nothing more is asked of a database that cannot be reached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_shorter_than_a_stock_topic_fails_and_auto_follows_the_topic() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let topic = stock_topics("pre_keep").await;
    let mut s = settings(&store, &topic, &provider);
    s.retention.keep = Keep::For(Duration::from_secs(7 * 24 * 3600));
    let report = checks(Ok(s.clone())).await;
    assert_fails(
        &report,
        "retention.keep",
        &[&topic, "retention.ms 7days", "segment.ms 7days", "\"auto\""],
    );
    s.retention.keep = Keep::Auto;
    let report = checks(Ok(s)).await;
    let keep = report.get("retention.keep").unwrap();
    assert_eq!(keep.status, Status::Ok, "{keep:#?}");
    assert!(keep.detail.contains("14days"), "{keep:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_does_not_load_is_the_first_failed_check() {
    let config = config_file(
        &"[store]\nurl = \"postgres://x@127.0.0.1/db\"\n[kafka]\ntopics = [\"t\"]\nbatch_sise = 10\n"
            .parse()
            .unwrap(),
    );
    let ran = run(&config, &["check", "--output", "json"], &[]);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    let report: serde_json::Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(report["ok"], false);
    let first = &report["checks"][0];
    assert_eq!(
        (&first["check"], &first["status"]),
        (&"config".into(), &"fail".into())
    );
    assert!(
        first["detail"].as_str().unwrap().contains("batch_sise"),
        "{first}"
    );

    // A transport without a handler URL is refused by name, as dedupq run does.
    let config = config_file(&"[kafka]\ntopics = [\"t\"]\n".parse().unwrap());
    let ran = run(&config, &["check"], &[]);
    assert_eq!(ran.code, 1);
    assert!(
        ran.stdout.starts_with("fail  config") && ran.stdout.contains("handler.url"),
        "{}",
        ran.stdout
    );
}

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
