//! The forwarder could not talk to a real provider or webhook target: no
//! static headers, every original header dropped, one URL for everything.
//! A `dedupq run` here forwards over mutual TLS (`ca_file`,
//! `client_identity_file`) to an HTTPS target of the test's own, with
//! static headers from a secret file and from the environment (never in
//! the log or `dedupq config`), only the `pass_headers` of the message,
//! and the URL its topic, queue and tenant route to.

use super::tls_target::{Certs, Received, Target};
use crate::support::amqp::{self, Client, Msg};
use crate::support::payments::{self, TENANT};
use crate::support::process::Dedupq;
use crate::support::{cli, eventually, isolated_store, kafka, unique};
use dedupq::config::HandlerSettings;
use dedupq::engine::Outcome;
use dedupq::handler::HttpHandler;
use dedupq::store::KeyStatus;
use dedupq::transport::amqp::QueueType;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const FILE_SECRET: &str = "Bearer sk_live_from_a_file_4242";
const ENV_SECRET: &str = "env-secret-9191";
const ENV_VAR: &str = "DEDUPQ_TEST_TARGET_API_KEY";
const BODY: &[u8] = br#"{"event":"payment.succeeded","amount":1500}"#;

struct Sources {
    main: String,
    other: String,
    queue: String,
}

fn handler_section(target: &Target, certs: &Certs, secret: &Path, s: &Sources) -> String {
    let base = &target.base;
    format!(
        r#"
[handler]
kind = "http"
url = "{base}/default"
timeout = "5s"
ca_file = "{ca}"
client_identity_file = "{identity}"
pass_headers = ["traceparent", "x-webhook-signature"]
routes = [
  {{ source = "{other}", url = "{base}/other-topic" }},
  {{ source = "{main}", tenant = "globex", url = "{base}/globex" }},
  {{ source = "{queue}", url = "{base}/queue" }},
]

[handler.headers]
Authorization = {{ file = "{secret}" }}
X-Api-Key = {{ env = "{ENV_VAR}" }}
"#,
        ca = certs.ca.display(),
        identity = certs.client_identity.display(),
        secret = secret.display(),
        main = s.main,
        other = s.other,
        queue = s.queue,
    )
}

fn one<'a>(got: &'a [Received], key: &str) -> &'a Received {
    let found: Vec<&Received> = got
        .iter()
        .filter(|r| r.header("x-dedupq-key") == [key])
        .collect();
    assert_eq!(found.len(), 1, "{key}: {got:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarder_sends_static_and_passed_headers_over_mutual_tls_to_the_routed_url() {
    let certs = Certs::make();
    let target = Target::start(&certs).await;
    let secret = certs.ca.with_file_name("authorization");
    std::fs::write(&secret, format!("{FILE_SECRET}\n")).unwrap();
    let (store, store_settings) = isolated_store().await;
    let (main, _) = kafka::topics("fwd", 1).await;
    let (other, _) = kafka::topics("fwd2", 1).await;
    let amqp_settings = amqp::settings(QueueType::Quorum);
    let sources = Sources {
        main: main.clone(),
        other: other.clone(),
        queue: amqp_settings.queues[0].clone(),
    };
    let text = format!(
        "[store]\nurl = \"{url}\"\nschema = \"{schema}\"\nmax_connections = 4\n\
         [kafka]\ntopics = [\"{main}\", \"{other}\"]\nbrokers = \"{brokers}\"\n\
         group_id = \"{group}\"\ncommit_interval = \"200ms\"\n\
         [retention]\nredelivery_horizon = \"1h\"\n[log]\nfilter = \"debug\"\n{handler}",
        url = store_settings.url.expose(),
        schema = store_settings.schema.as_deref().unwrap(),
        brokers = kafka::brokers(),
        group = unique("g"),
        handler = handler_section(&target, &certs, &secret, &sources),
    );
    let mut config: toml::Table = text.parse().expect("valid TOML");
    config.insert("amqp".into(), amqp::config_section(&amqp_settings));
    let mut dedupq = Dedupq::launch(&config, &[(ENV_VAR, ENV_SECRET)]);
    dedupq.wait_ready(WAIT).await.expect("dedupq starts");

    let producer = kafka::producer();
    let mut headers = kafka::headers(TENANT, "fw-1");
    for (name, value) in [
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("x-webhook-signature", "t=1,v1=abc"),
        ("x-internal-token", "never-forwarded"),
    ] {
        headers.push((name.into(), value.as_bytes().to_vec()));
    }
    kafka::produce(&producer, &main, 0, &headers, BODY).await;
    kafka::produce(&producer, &main, 0, &kafka::headers("globex", "fw-2"), BODY).await;
    kafka::produce(&producer, &other, 0, &kafka::headers(TENANT, "fw-3"), BODY).await;
    let client = Client::connect().await;
    client
        .publish(
            &sources.queue,
            &Msg::new(TENANT, "fw-4", std::str::from_utf8(BODY).unwrap()),
        )
        .await;

    let got = eventually(WAIT, "four requests reached the target", || async {
        let got = target.received();
        (got.len() >= 4).then_some(got)
    })
    .await;
    for (key, tenant, path) in [
        ("fw-1", TENANT, "/default"),
        ("fw-2", "globex", "/globex"),
        ("fw-3", TENANT, "/other-topic"),
        ("fw-4", TENANT, "/queue"),
    ] {
        let r = one(&got, key);
        assert_eq!(r.path, path, "{key}");
        assert_eq!(r.body, BODY, "{key}");
        assert_eq!(r.header("authorization"), [FILE_SECRET], "{key}");
        assert_eq!(r.header("x-api-key"), [ENV_SECRET], "{key}");
        let derived = format!("{tenant}:{key}");
        assert_eq!(r.header("idempotency-key"), [derived.as_str()], "{key}");
        assert_eq!(r.header("x-dedupq-tenant"), [tenant], "{key}");
        assert_eq!(r.header("x-dedupq-attempt"), ["1"], "{key}");
        assert_eq!(r.header("x-dedupq-epoch"), ["1"], "{key}");
        assert_eq!(r.header("x-dedupq-owner").len(), 1, "{key}");
        assert!(
            r.header("client-id").is_empty(),
            "{key}: identity headers stay"
        );
    }
    let first = one(&got, "fw-1");
    assert_eq!(
        first.header("traceparent"),
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]
    );
    assert_eq!(first.header("x-webhook-signature"), ["t=1,v1=abc"]);
    assert!(first.header("x-internal-token").is_empty(), "not listed");
    for key in ["fw-1", "fw-2", "fw-3", "fw-4"] {
        let identity_tenant = if key == "fw-2" { "globex" } else { TENANT };
        let id = dedupq::identity::Identity {
            tenant: dedupq::identity::Tenant::parse(identity_tenant.as_bytes()).unwrap(),
            key: dedupq::identity::IdempotencyKey::parse(key.as_bytes()).unwrap(),
        };
        eventually(WAIT, "stored done", || async {
            let row = store.show_key(&id).await.unwrap()?;
            (row.status == KeyStatus::Done).then_some(())
        })
        .await;
    }

    let printed = cli::run(
        &cli::config_file(&config),
        &["config"],
        &[(ENV_VAR, ENV_SECRET)],
    );
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    assert!(printed.stdout.contains(ENV_VAR), "{}", printed.stdout);
    dedupq.kill();
    for (what, text) in [("the log", dedupq.log()), ("dedupq config", printed.stdout)] {
        for secret in ["sk_live_from_a_file_4242", ENV_SECRET] {
            assert!(!text.contains(secret), "{what} shows {secret}");
        }
    }
    client.cleanup(&amqp_settings).await;
}

/// The same target without the client certificate, or without the CA:
/// the TLS handshake fails and nothing reaches it — so the requests above
/// did go through the configured mutual TLS. Nothing is stored either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_client_certificate_or_the_ca_nothing_reaches_the_target() {
    let certs = Certs::make();
    let target = Target::start(&certs).await;
    let (store, _) = isolated_store().await;
    for (key, ca, identity) in [
        ("no-identity", Some(certs.ca.clone()), None),
        ("no-ca", None, Some(certs.client_identity.clone())),
    ] {
        let handler = HttpHandler::new(&HandlerSettings {
            url: format!("{}/default", target.base),
            timeout: Duration::from_secs(5),
            ca_file: ca,
            client_identity_file: identity,
            ..HandlerSettings::default()
        })
        .unwrap();
        let engine =
            crate::support::engine(&store, Arc::new(handler), crate::support::fast_options());
        let d = engine
            .process(&[crate::support::message(TENANT, key, "{}")])
            .await
            .unwrap();
        // An untrusted server certificate is refused before anything is
        // sent: a configuration fault. A refused client certificate may
        // only be told after the request went out (TLS 1.3), so unknown.
        let expected: &[Outcome] = match key {
            "no-ca" => &[Outcome::Fault],
            _ => &[Outcome::Fault, Outcome::Retried, Outcome::Unknown],
        };
        assert!(expected.contains(&d[0].outcome), "{key}: {:?}", d[0]);
        let row = payments::row(&store, key).await.expect("claimed");
        assert_eq!(row.result_status, None, "{key}: nothing stored");
    }
    assert!(target.received().is_empty(), "{:?}", target.received());
}

/// The example of the forwarder's settings in docs/handlers.md is a valid
/// configuration, and a static header whose variable is missing stops
/// start-up naming the setting, the header and the variable.
#[test]
fn the_documented_forwarder_example_parses_and_a_missing_secret_names_its_source() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/handlers.md")).unwrap();
    let example = crate::support::fenced_blocks(&readme, "toml")
        .into_iter()
        .find(|b| b.contains("[handler.headers]") && !b.contains("[store]"))
        .expect("the forwarder example");
    let settings: dedupq::config::Settings = toml::from_str(&example).expect("valid settings");
    assert_eq!(settings.handler.routes.len(), 2);
    assert_eq!(settings.handler.headers.len(), 3);

    let mut handler = settings.handler.clone();
    handler.ca_file = None;
    handler.client_identity_file = None;
    handler.headers.remove("Authorization");
    let missing = HttpHandler::new(&handler)
        .err()
        .expect("PROVIDER_API_KEY is not set");
    let text = missing.to_string();
    assert!(
        text.contains("handler.headers")
            && text.contains("X-Api-Key")
            && text.contains("PROVIDER_API_KEY"),
        "{text}"
    );
}
