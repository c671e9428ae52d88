//! Secrets stay secret: `dedupq config` and the logs show `***` for
//! passwords in URLs (user info and `?password=`), for credentials in
//! `handler.url` and for secret `[kafka.client]` properties, whether they
//! come from the file, from `*_file` settings or from the environment.

use super::roles::RuntimeRole;
use crate::support::process::{base_config, dedupq_command, Dedupq, Provider};
use crate::support::{self, unique};
use dedupq::config::Settings;
use dedupq_provider::Knobs;
use std::path::{Path, PathBuf};
use std::time::Duration;

const STORE_URL: &str =
    "postgres://app:pg-userinfo-S3CRET@127.0.0.1:5432/pay?sslmode=prefer&password=pg-query-S3CRET";
const AMQP_URL: &str = "amqps://pay:amqp-S3CRET@127.0.0.1:5671/%2f";
const HANDLER_URL: &str =
    "https://merchant:handler-S3CRET@psp.example/charges?token=handler-token-S3CRET";
const KAFKA_PASSWORD: &str = "kafka-sasl-S3CRET";
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----inline-key-S3CRET";
const KEY_PASSWORD: &str = "ssl-key-S3CRET";
const OAUTH_SECRET: &str = "oauth-client-S3CRET";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A configuration whose secrets come from a file, `*_file` settings and
/// (in `ENV`) the environment.
fn secret_config() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("secrets"));
    std::fs::create_dir_all(&dir).unwrap();
    let store = write(&dir, "store-url", &format!("{STORE_URL}\n"));
    let amqp = write(&dir, "amqp-url", AMQP_URL);
    let kafka = write(&dir, "kafka-password", &format!("{KAFKA_PASSWORD}\n"));
    let config = format!(
        r#"
[store]
url_file = "{store}"
[handler]
kind = "http"
url = "{HANDLER_URL}"
[amqp]
url_file = "{amqp}"
[kafka.client]
"security.protocol" = "SASL_SSL"
"ssl.key.pem" = "{KEY_PEM}"
[kafka.client_files]
"sasl.password" = "{kafka}"
"#,
        store = store.display(),
        amqp = amqp.display(),
        kafka = kafka.display(),
    );
    write(&dir, "dedupq.toml", &config)
}

const ENV: [(&str, &str); 3] = [
    ("DEDUPQ__KAFKA__CLIENT__SSL_KEY_PASSWORD", KEY_PASSWORD),
    (
        "DEDUPQ__KAFKA__CLIENT__SASL_OAUTHBEARER_CLIENT_SECRET",
        OAUTH_SECRET,
    ),
    ("DEDUPQ__KAFKA__CLIENT__SASL_USERNAME", "payments-user"),
];

const SECRETS: [&str; 8] = [
    "pg-userinfo-S3CRET",
    "pg-query-S3CRET",
    "amqp-S3CRET",
    "handler-S3CRET",
    "handler-token-S3CRET",
    KAFKA_PASSWORD,
    "inline-key-S3CRET",
    KEY_PASSWORD,
];

fn leaked<'a>(text: &str, secrets: &[&'a str]) -> Vec<&'a str> {
    secrets
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect()
}

#[test]
fn dedupq_config_hides_every_secret_from_files_the_environment_and_urls() {
    let config = secret_config();
    let mut command = dedupq_command();
    let out = command
        .args(["config", "--config"])
        .arg(&config)
        .envs(ENV)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");

    let mut all = SECRETS.to_vec();
    all.push(OAUTH_SECRET);
    assert_eq!(leaked(&text, &all), Vec::<&str>::new(), "{text}");
    assert!(
        !text.contains("sasl_username"),
        "variables map to dotted names"
    );
    // Resolved (from files and variables) and then hidden, not dropped.
    for shown in [
        r#""sasl.password" = "***""#,
        r#""ssl.key.password" = "***""#,
        r#""sasl.oauthbearer.client.secret" = "***""#,
        r#""ssl.key.pem" = "***""#,
        r#""sasl.username" = "payments-user""#,
        "app:***@127.0.0.1:5432/pay",
        "password=***",
        "pay:***@127.0.0.1:5671",
        "merchant:***@psp.example/charges?token=***",
    ] {
        assert!(text.contains(shown), "{shown} in:\n{text}");
    }
}

/// What the check above catches: the settings printed without redaction
/// carry every secret that came from a file.
#[test]
fn the_settings_themselves_hold_the_secrets_read_from_files() {
    let settings = Settings::load(Some(&secret_config())).unwrap();
    let raw = toml::to_string(&settings).unwrap();
    for secret in [
        "pg-userinfo-S3CRET",
        "pg-query-S3CRET",
        "amqp-S3CRET",
        KAFKA_PASSWORD,
    ] {
        assert!(raw.contains(secret), "{secret}");
    }
    let redacted = toml::to_string(&settings.redacted()).unwrap();
    assert_eq!(leaked(&redacted, &SECRETS), Vec::<&str>::new());
}

#[tokio::test]
async fn start_up_logs_never_show_the_database_password_or_handler_credentials() {
    let (_, owner) = support::isolated_store().await;
    let schema = owner.schema.clone().unwrap();
    let role = RuntimeRole::create(&schema).await;
    let provider = Provider::start(Knobs::default()).await;
    let dir = std::env::temp_dir().join(unique("secrets"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!(
        "postgres://{}@127.0.0.1:5432/postgres?password={}",
        role.name, role.password
    );
    let url_file = write(&dir, "store-url", &url);

    let mut config = base_config(&owner, &provider);
    let store = config["store"].as_table_mut().unwrap();
    store.remove("url");
    store.insert("url_file".into(), url_file.display().to_string().into());
    store.insert("migrate".into(), "check".into());
    let handler = config["handler"].as_table_mut().unwrap();
    let charges = provider
        .charges_url()
        .replace("http://", "http://merchant:handler-S3CRET@");
    handler.insert("url".into(), charges.into());
    let mut dedupq = Dedupq::launch(&config, &[]);
    dedupq
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("ready with the runtime role");
    let log = dedupq.log();
    dedupq.kill();
    role.drop().await;

    assert!(
        log.contains("password=***"),
        "the store URL is logged, hidden:\n{log}"
    );
    let password = role_password_in(&url);
    assert_eq!(
        leaked(&log, &[password.as_str(), "handler-S3CRET"]),
        Vec::<&str>::new(),
        "{log}"
    );
}

fn role_password_in(url: &str) -> String {
    url.rsplit_once("password=").unwrap().1.to_string()
}
