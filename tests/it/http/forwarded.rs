//! What of a request reaches the handler: the headers `handler.pass_headers`
//! names (a webhook's signature, for a downstream that verifies it again)
//! and, through a broker on async routes, the request's own
//! `Content-Type`. And a repeat on an async route of a key held `unknown`
//! answers what the sync route answers.

use super::harness::{client, App, Reply, ACME_KEY};
use crate::support::process::Provider;
use crate::support::{eventually, kafka, unique};
use axum::http::HeaderMap;
use dedupq::config::{HandlerKind, RouteSettings};
use dedupq_provider::Knobs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "shop-1"}"#;

/// An HTTP target of the test's own: records every request, answers 201.
#[derive(Clone, Default)]
struct Target {
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

impl Target {
    async fn start(&self) -> String {
        let seen = self.seen.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(headers);
                (axum::http::StatusCode::CREATED, r#"{"charged":true}"#)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn requests(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

async fn post(app: &App, route: &str, key: &str, content_type: &str) -> Reply {
    let r = client()
        .post(app.url(route))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", key)
        .header("content-type", content_type)
        .header("x-request-signature", "sig-1")
        .header("x-not-passed", "private")
        .body(BODY)
        .send()
        .await
        .expect("the API answers");
    Reply::from(r).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_handler_gets_the_pass_headers_of_a_request_and_an_async_requests_own_content_type() {
    let provider = Provider::start(Knobs::default()).await;
    let target = Target::default();
    let url = target.start().await;
    let (topic, _) = kafka::topics("dqt_fwd", 1).await;
    let app = App::with(&provider, |s, _| {
        s.handler.kind = HandlerKind::Http;
        s.handler.url = url.clone();
        s.handler.pass_headers.push("x-request-signature".into());
        s.kafka = kafka::settings(&topic, &unique("g"));
        let later: RouteSettings = toml::from_str(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"kafka\", topic = \"{topic}\" }}"
        ))
        .expect("route");
        s.api.routes.push(later);
    })
    .await;
    app.wait_ready().await;

    let sync = post(&app, "payments", "pay-f1", "application/json").await;
    assert_eq!(sync.status, 201, "{sync:?}");
    let accepted = post(&app, "later", "pay-f2", "application/vnd.acme.payment+json").await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    let seen = eventually(Duration::from_secs(30), "both forwarded", || async {
        let seen = target.requests();
        (seen.len() == 2).then_some(seen)
    })
    .await;
    for (n, h) in seen.iter().enumerate() {
        assert_eq!(
            header(h, "x-request-signature"),
            Some("sig-1"),
            "request {n}"
        );
        assert_eq!(header(h, "x-not-passed"), None, "request {n}: not listed");
    }
    let by_key = |key: &str| {
        seen.iter()
            .find(|h| header(h, "x-dedupq-key") == Some(key))
            .unwrap_or_else(|| panic!("{key} forwarded"))
            .clone()
    };
    assert_eq!(
        header(&by_key("pay-f2"), "content-type"),
        Some("application/vnd.acme.payment+json"),
        "the async request's content type, through Kafka"
    );
    assert_eq!(
        header(&by_key("pay-f1"), "content-type"),
        Some("application/json")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeat_on_an_async_route_of_a_key_held_unknown_answers_unknown_as_the_sync_route_does() {
    // Charges and never answers: the one attempt allowed ends unknown.
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("dqt_unknown", 1).await;
    let app = App::with(&provider, |s, _| {
        s.engine.max_attempts = 1;
        s.handler.timeout = Duration::from_millis(500);
        s.kafka = kafka::settings(&topic, &unique("g"));
        let later: RouteSettings = toml::from_str(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"kafka\", topic = \"{topic}\" }}"
        ))
        .expect("route");
        s.api.routes.push(later);
    })
    .await;
    app.wait_ready().await;
    let first = app
        .post("later", Some(ACME_KEY), Some("pay-u1"), BODY)
        .await;
    assert_eq!(first.status, 202, "{first:?}");
    eventually(Duration::from_secs(30), "held unknown", || async {
        (app.status("acme", "pay-u1").await.as_deref() == Some("unknown")).then_some(())
    })
    .await;
    let repeat = app
        .post("later", Some(ACME_KEY), Some("pay-u1"), BODY)
        .await;
    assert_eq!(
        repeat.problem(504),
        "urn:dedupq:problem:outcome-unknown",
        "{repeat:?}"
    );
}
