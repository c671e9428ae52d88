//! /healthz and /readyz answer from the first moment, also while
//! PostgreSQL cannot be reached at start-up (a liveness probe must not kill
//! a pod that waits for its database); /readyz says why it is not ready.

use crate::support::forward::forward;
use crate::support::process::{base_config, free_port, Dedupq, Provider};
use crate::support::{self, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq_provider::Knobs;
use std::time::Duration;
use tokio::net::TcpListener;

/// dedupq started against `url`, migrating `schema`; and its HTTP base.
fn launch(provider: &Provider, url: String, schema: &str) -> (Dedupq, String) {
    let store = StoreSettings {
        url: SecretUrl::new(url),
        schema: Some(schema.to_owned()),
        ..StoreSettings::default()
    };
    let dedupq = Dedupq::launch(&base_config(&store, provider), &[]);
    let base = format!("http://{}", dedupq.http);
    (dedupq, base)
}

async fn get(url: &str) -> Option<(u16, String)> {
    let r = reqwest::get(url).await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.ok()?))
}

#[tokio::test]
async fn probes_answer_while_postgresql_is_unreachable_and_ready_follows_it() {
    let provider = Provider::start(Knobs::default()).await;
    let port = free_port();
    let schema = unique("probe");
    let url = format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres");
    let (mut dedupq, base) = launch(&provider, url, &schema);

    let alive = support::eventually(Duration::from_secs(10), "/healthz", || async {
        get(&format!("{base}/healthz")).await
    })
    .await;
    assert_eq!(alive.0, 200);
    let readyz = support::eventually(Duration::from_secs(10), "/readyz with a reason", || async {
        let (status, body) = get(&format!("{base}/readyz")).await?;
        (status == 503 && body.contains("store down: unreachable:")).then_some(body)
    })
    .await;
    assert!(readyz.to_lowercase().contains("refused"), "{readyz}");
    assert!(dedupq.exit_status().is_none(), "it waits for PostgreSQL");

    let forwarder = forward(port, "127.0.0.1:5432".into()).await;
    dedupq
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("ready once PostgreSQL answers");
    let admin = sqlx::PgPool::connect(&support::database_url())
        .await
        .unwrap();
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("\"{schema}\".dedupq_keys"))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(table.is_some(), "migrated once PostgreSQL answered");
    dedupq.kill();
    forwarder.abort();
}

/// A role PostgreSQL does not know (yet) is not an outage: /readyz and the
/// log name `store.url`, dedupq keeps trying, and once a database operator
/// creates the role it starts.
#[tokio::test]
async fn a_role_postgresql_refuses_is_named_as_store_url_and_start_up_follows_its_creation() {
    let provider = Provider::start(Knobs::default()).await;
    let role = unique("late_role");
    let password = "late-role-secret";
    let schema = unique("late");
    let url = format!("postgres://{role}:{password}@127.0.0.1:5432/postgres");
    let (mut dedupq, base) = launch(&provider, url, &schema);

    let readyz = support::eventually(
        Duration::from_secs(20),
        "/readyz naming store.url",
        || async {
            let (status, body) = get(&format!("{base}/readyz")).await?;
            (status == 503 && body.contains("credentials refused (store.url):")).then_some(body)
        },
    )
    .await;
    assert!(
        readyz.contains(&role),
        "the refused role is named: {readyz}"
    );
    assert!(
        !readyz.contains(password),
        "the password stays out of /readyz: {readyz}"
    );
    let log = support::eventually(
        Duration::from_secs(20),
        "a log line naming store.url",
        || async {
            let log = dedupq.log();
            log.contains("refused the role or password of store.url")
                .then_some(log)
        },
    )
    .await;
    assert!(!log.contains(password), "the password stays out of the log");
    assert!(dedupq.exit_status().is_none(), "it waits for the role");

    let admin = sqlx::PgPool::connect(&support::database_url())
        .await
        .unwrap();
    for sql in [
        format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
        format!("GRANT CREATE ON DATABASE postgres TO {role}"),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    let ready = dedupq.wait_ready(Duration::from_secs(30)).await;
    dedupq.kill();
    for sql in [
        format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
        format!("DROP OWNED BY {role}"),
        format!("DROP ROLE {role}"),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    ready.expect("ready once the role exists");
}

/// A stop asked for while dedupq still waits for PostgreSQL is a clean
/// stop: SIGTERM the moment the operator port answers (a script or an
/// orchestrator that gives up on a pod that never got ready) ends the
/// process with status 0, never by the signal's default action. An answer
/// from `/healthz`, not a bare connect: the port was chosen before dedupq
/// started, and a connect could reach some other listener on it.
#[tokio::test]
async fn sigterm_while_waiting_for_postgresql_is_a_clean_stop() {
    let provider = Provider::start(Knobs::default()).await;
    let port = free_port();
    let url = format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres");
    let (mut dedupq, base) = launch(&provider, url, &unique("stop_early"));

    let alive = support::eventually(Duration::from_secs(20), "/healthz", || async {
        get(&format!("{base}/healthz")).await
    })
    .await;
    assert_eq!(alive.0, 200, "{}", alive.1);
    dedupq.signal("-TERM");
    let status = dedupq.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.success(),
        "exited with {status}:\n{}",
        dedupq.log_tail()
    );
    assert!(
        dedupq
            .log()
            .contains("stopped while waiting for PostgreSQL"),
        "{}",
        dedupq.log_tail()
    );
}

/// The process harness never mistakes another server on dedupq's operator
/// port for dedupq: with a listener that answers 200 to anything holding
/// the port when the process starts again, it starts on another port and
/// its /healthz answers.
#[tokio::test]
async fn the_process_harness_moves_off_an_operator_port_another_listener_took() {
    let (_, store) = support::isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let mut dedupq = Dedupq::start(&base_config(&store, &provider)).await;
    let first = dedupq.http;
    dedupq.kill();

    let squatter = TcpListener::bind(first).await.expect("take the port");
    let answering = tokio::spawn(async move {
        while let Ok((mut stream, _)) = squatter.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                    .await;
            });
        }
    });
    dedupq.restart().await;
    answering.abort();

    assert_ne!(dedupq.http, first, "restarted on the squatted port");
    let (status, body) = get(&format!("http://{}/healthz", dedupq.http))
        .await
        .expect("/healthz answers");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert!(
        dedupq.log().contains("binding http.listen"),
        "the refused bind is in the log:\n{}",
        dedupq.log_tail()
    );
}
