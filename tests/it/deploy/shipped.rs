//! The configurations dedupq ships, started as shipped against brokers
//! with Kafka's stock settings (7-day retention, each topic created on
//! purpose): `deploy/dedupq.toml` as docker-compose.yml runs it, and the
//! Kubernetes ConfigMap's TOML. Each must start and charge a payment from
//! Kafka and one from RabbitMQ, after its own migrate step.
//!
//! Rendering does what the platform would: service host names become the
//! local services' addresses, mounted secret paths become files holding
//! the local values, and topic, queue and group names get a unique suffix
//! so tests never share them. Nothing else of the configuration changes.

use crate::support::endpoints::endpoints;
use crate::support::process::{Dedupq, Provider};
use crate::support::{amqp, database_url, eventually, kafka, unique};
use dedupq_provider::Knobs;
use serde_yaml::Value;
use sqlx::{Executor, PgPool};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Kafka's defaults, set on each topic so the test broker's shorter ones
/// do not apply.
const STOCK: &[(&str, &str)] = &[("retention.ms", "604800000"), ("segment.ms", "604800000")];

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A database of its own, as a fresh deployment has.
struct Database {
    name: String,
    admin: PgPool,
}

impl Database {
    async fn create() -> Self {
        let admin = PgPool::connect(&database_url()).await.unwrap();
        let name = unique("dq_shipped");
        admin
            .execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap();
        Self { name, admin }
    }

    fn url(&self) -> String {
        format!("postgres://postgres:postgres@127.0.0.1:5432/{}", self.name)
    }

    async fn drop(self) {
        let sql = format!("DROP DATABASE {} WITH (FORCE)", self.name);
        self.admin.execute(sql.as_str()).await.unwrap();
    }
}

/// Secret files of one rendering.
struct Secrets {
    dir: PathBuf,
    /// Path inside the container → file here.
    mounted: BTreeMap<String, PathBuf>,
}

impl Secrets {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("dedupq-shipped"));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            dir,
            mounted: BTreeMap::new(),
        }
    }

    fn mount(&mut self, container_path: &str, value: &str) {
        let file = self.dir.join(format!("secret-{}", self.mounted.len()));
        std::fs::write(&file, format!("{value}\n")).unwrap();
        self.mounted.insert(container_path.to_string(), file);
    }

    /// `text` with every mounted path replaced by its file here.
    fn apply(&self, text: &str) -> String {
        self.mounted.iter().fold(text.to_string(), |t, (from, to)| {
            t.replace(&format!("\"{from}\""), &format!("\"{}\"", to.display()))
        })
    }
}

/// Unique names for the shipped topic, queue and group.
struct Names {
    topic: String,
    queue: String,
    group: String,
}

impl Names {
    fn new() -> Self {
        Self {
            topic: unique("shipped"),
            // The test broker's expiry policy tidies dqt* queues.
            queue: unique("dqt_shipped"),
            group: unique("g"),
        }
    }

    /// The configuration's `[kafka]` and `[amqp]` names made unique.
    fn apply(&self, config: &mut toml::Table, topic: &str) {
        let kafka = config["kafka"].as_table_mut().expect("[kafka]");
        kafka.insert("topics".into(), vec![self.topic.clone()].into());
        kafka.insert("group_id".into(), self.group.clone().into());
        if let Some(reply) = kafka.get("reply_topic").and_then(|r| r.as_str()) {
            let renamed = reply.replace(topic, &self.topic);
            kafka.insert("reply_topic".into(), renamed.into());
        }
        let amqp = config["amqp"].as_table_mut().expect("[amqp]");
        amqp.insert("queues".into(), vec![self.queue.clone()].into());
    }
}

/// Runs `dedupq migrate`, as the platform's migrate step does.
fn migrate(args: &[&str], env: &[(&str, &Path)]) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dedupq"));
    command.arg("migrate").args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.env_remove("DEDUPQ__STORE__URL").output().unwrap();
    assert!(
        out.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `config`, sends one payment through Kafka and one through
/// RabbitMQ, and waits for both charges.
async fn starts_and_charges(config: &toml::Table, names: &Names, provider: &Provider) {
    let mut dedupq = Dedupq::launch(config, &[]);
    dedupq
        .wait_ready(Duration::from_secs(90))
        .await
        .expect("the shipped configuration starts");
    let body = br#"{"amount": 100, "currency": "EUR"}"#;
    let producer = kafka::producer();
    kafka::produce(
        &producer,
        &names.topic,
        0,
        &kafka::headers("acme", "k-1"),
        body,
    )
    .await;
    let rabbit = amqp::Client::connect().await;
    let msg = amqp::Msg::new("acme", "a-1", std::str::from_utf8(body).unwrap());
    rabbit.publish(&names.queue, &msg).await;
    eventually(Duration::from_secs(60), "both payments charged", || async {
        (provider.stats().await.charges == 2).then_some(())
    })
    .await;
    for key in ["acme:k-1", "acme:a-1"] {
        assert_eq!(provider.charges_for(key).await.len(), 1, "{key}");
    }
    assert!(dedupq.terminate(Duration::from_secs(60)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_configuration_starts_against_stock_kafka_and_charges_a_payment() {
    let compose = yaml("docker-compose.yml");
    let service = &compose["services"]["dedupq"];
    // `run --config <path>`, the path mounted from a file of the repository.
    let command: Vec<&str> = service["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = command.iter().position(|a| *a == "--config").unwrap();
    let config_path = command[at + 1];
    let volume = service["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|v| v.split(':').nth(1) == Some(config_path))
        .expect("the config file is mounted");
    let shipped = repo(volume.split(':').next().unwrap().trim_start_matches("./"));

    // Compose secrets appear under /run/secrets/<name>; their files name
    // compose's services, here the local ones.
    let db = Database::create().await;
    let mut secrets = Secrets::new();
    for (name, secret) in compose["secrets"].as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        let file = secret["file"].as_str().unwrap().trim_start_matches("./");
        let value = repo(file)
            .trim()
            .replace(
                "@postgres:5432/postgres",
                &format!("@127.0.0.1:5432/{}", db.name),
            )
            .replace("@rabbitmq:5672", "@127.0.0.1:5672");
        secrets.mount(&format!("/run/secrets/{name}"), &value);
    }
    let provider = Provider::start(Knobs::default()).await;
    let rendered = secrets
        .apply(&shipped)
        .replace("\"kafka:9092\"", &format!("\"{}\"", kafka::brokers()))
        .replace("http://provider:8081", &provider.base);
    let mut config: toml::Table = rendered.parse().expect("the shipped TOML");
    let shipped_topic = config["kafka"]["topics"][0].as_str().unwrap().to_string();

    // The `topics` service creates every topic the configuration needs,
    // as an operator would on a broker without auto-create.
    let topics = compose["services"]["topics"]["command"][0]
        .as_str()
        .expect("a topics service");
    let names = Names::new();
    let mut created = Vec::new();
    for part in topics.split("--topic ").skip(1) {
        let name = part.split_whitespace().next().unwrap();
        let renamed = name.replace(&shipped_topic, &names.topic);
        kafka::create_topic_with(&renamed, 1, STOCK).await;
        created.push(renamed);
    }
    assert!(
        created.contains(&format!("{}.dlq", names.topic)),
        "{created:?}"
    );
    names.apply(&mut config, &shipped_topic);

    // The `migrate` service: `dedupq migrate` with its own environment.
    let migrate_service = &compose["services"]["migrate"];
    assert_eq!(migrate_service["command"][0].as_str(), Some("migrate"));
    let env = migrate_service["environment"].as_mapping().unwrap();
    let url_file = env["DEDUPQ__STORE__URL_FILE"].as_str().unwrap();
    migrate(
        &[],
        &[("DEDUPQ__STORE__URL_FILE", &secrets.mounted[url_file])],
    );

    starts_and_charges(&config, &names, &provider).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_configmap_starts_over_sasl_and_tls_and_charges_a_payment() {
    let map = yaml("deploy/kubernetes/configmap.yaml");
    let shipped = map["data"]["dedupq.toml"].as_str().unwrap();
    let migrate_toml = map["data"]["migrate.toml"].as_str().unwrap();
    let ep = endpoints();
    let db = Database::create().await;
    let provider = Provider::start(Knobs::default()).await;

    // The Secret's files and the CA, as the Deployment mounts them.
    let mut secrets = Secrets::new();
    secrets.mount("/run/secrets/dedupq/store-url", &db.url());
    secrets.mount("/run/secrets/dedupq/handler-url", &provider.charges_url());
    secrets.mount("/run/secrets/dedupq/kafka-password", &ep.kafka_password());
    secrets.mount("/run/secrets/dedupq/amqp-url", &ep.get("AMQPS_URL"));
    let ca = std::fs::read_to_string(ep.ca()).unwrap();
    secrets.mount("/etc/dedupq/tls/ca.pem", ca.trim());

    let mut config: toml::Table = secrets
        .apply(shipped)
        .replace(
            "\"kafka-bootstrap.kafka.svc:9093\"",
            &format!("\"{}\"", ep.get("KAFKA_SASL_BROKERS")),
        )
        .parse()
        .expect("the ConfigMap's TOML");
    for (k, v) in &ep.kafka_client(&ep.ca()) {
        if k != "ssl.ca.location" {
            let shipped = config["kafka"]["client"][k.as_str()].as_str();
            assert_eq!(shipped, Some(v.as_str()), "the ConfigMap's {k}");
        }
    }
    let shipped_topic = config["kafka"]["topics"][0].as_str().unwrap().to_string();
    let names = Names::new();
    names.apply(&mut config, &shipped_topic);
    let reply = config["kafka"]["reply_topic"].as_str().unwrap().to_string();
    for topic in [names.topic.clone(), format!("{}.dlq", names.topic), reply] {
        kafka::create_topic_with(&topic, 1, STOCK).await;
    }

    // The migrate Job's configuration, as the owner role (here the same).
    let migrate_file = secrets.dir.join("migrate.toml");
    std::fs::write(&migrate_file, secrets.apply(migrate_toml)).unwrap();
    migrate(&["--config", migrate_file.to_str().unwrap()], &[]);

    starts_and_charges(&config, &names, &provider).await;
    db.drop().await;
}
