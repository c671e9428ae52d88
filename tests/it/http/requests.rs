//! What a request must be before anything is claimed: authenticated, with
//! a valid key and body within the limits; and how handler failures and
//! slow requests are answered.

use super::harness::{client, App, Reply, ACME_KEY};
use crate::support::count_rows;
use crate::support::process::{metric_value, Provider};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "acct-1"}"#;
const OTHER: &str = r#"{"amount": 200, "currency": "EUR", "recipient": "acct-2"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_or_invalid_key_or_body_answers_400_claims_nothing_and_the_fixed_request_goes_through(
) {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |_, _| {}).await;

    let r = app.post("payments", Some(ACME_KEY), None, BODY).await;
    assert_eq!(r.problem(400), "urn:dedupq:problem:invalid-key");
    for bad in ["has space", &"k".repeat(256), "ключ"] {
        let r = client()
            .post(app.url("payments"))
            .bearer_auth(ACME_KEY)
            .header(
                "Idempotency-Key",
                reqwest::header::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
            )
            .body(BODY)
            .send()
            .await
            .unwrap();
        let r = Reply::from(r).await;
        assert_eq!(r.problem(400), "urn:dedupq:problem:invalid-key", "{bad}");
    }
    let twice = client()
        .post(app.url("payments"))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", "k-1")
        .header("Idempotency-Key", "k-2")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        Reply::from(twice).await.problem(400),
        "urn:dedupq:problem:invalid-key"
    );
    for body in ["not json", "[1, 2]", ""] {
        let r = app.pay("pay-fix", body).await;
        assert_eq!(
            r.problem(400),
            "urn:dedupq:problem:invalid-request",
            "{body:?}"
        );
    }
    assert_eq!(count_rows(&app.store).await, 0, "nothing claimed");
    assert_eq!(provider.stats().await.charges, 0);
    assert_eq!(app.decided("http", "invalid"), 8);

    // The client fixes the body and sends it again with the same key.
    let fixed = app.pay("pay-fix", BODY).await;
    assert_eq!((fixed.status, fixed.replayed()), (201, false), "{fixed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_limit_answers_413_and_headers_over_the_limit_431() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |s, _| s.identity.max_body_bytes = 1024).await;
    let big = json!({ "amount": 1, "pad": "x".repeat(2000) }).to_string();

    assert_eq!(
        app.pay("pay-big", &big).await.problem(413),
        "urn:dedupq:problem:invalid-request"
    );
    // Without a declared length (chunked), the body is cut off once past the limit.
    let chunk = format!("{:x}\r\n{big}\r\n", big.len());
    let chunked = format!(
        "POST /v1/payments HTTP/1.1\r\nhost: dedupq\r\nauthorization: Bearer {ACME_KEY}\r\n\
         idempotency-key: pay-big\r\ntransfer-encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n"
    );
    let answer = raw(&app.base, &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");

    let huge_header = client()
        .post(app.url("payments"))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", "pay-h")
        .header("X-Padding", "p".repeat(20 * 1024))
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(huge_header.status(), 431);
    let mut many = client().post(app.url("payments")).bearer_auth(ACME_KEY);
    for i in 0..80 {
        many = many.header(format!("x-h{i}"), "v");
    }
    assert_eq!(many.body(BODY).send().await.unwrap().status(), 431);
    assert_eq!(count_rows(&app.store).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_need_an_api_key_and_the_tenant_never_comes_from_a_header_they_send() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |_, _| {}).await;

    let anonymous = app.post("payments", None, Some("pay-t1"), BODY).await;
    assert_eq!(anonymous.problem(401), "urn:dedupq:problem:unauthenticated");
    assert!(anonymous
        .header("www-authenticate")
        .unwrap()
        .starts_with("Bearer"));
    let wrong = app
        .post(
            "payments",
            Some("sk_test_acme_0123456780"),
            Some("pay-t1"),
            BODY,
        )
        .await;
    assert_eq!(wrong.problem(401), "urn:dedupq:problem:unauthenticated");

    // acme's key with a tenant header naming globex: acme's payment.
    let spoofed = client()
        .post(app.url("payments"))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", "pay-t1")
        .header("client-id", "globex")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), 201);
    assert_eq!(app.status("acme", "pay-t1").await.as_deref(), Some("done"));
    assert_eq!(app.status("globex", "pay-t1").await, None);
    assert_eq!(provider.charges_for("acme:pay-t1").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_trusted_gateway_the_gateway_header_names_the_tenant() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |s, _| {
        s.api.keys_file = None;
        s.api.tenant_header = Some("x-tenant".into());
        s.api.trusted_gateway = true;
    })
    .await;
    let send = |tenant: Option<&'static str>| {
        let mut r = client()
            .post(app.url("payments"))
            .header("Idempotency-Key", "pay-g1")
            .body(BODY);
        if let Some(t) = tenant {
            r = r.header("x-tenant", t);
        }
        async move { Reply::from(r.send().await.unwrap()).await }
    };
    assert_eq!(
        send(None).await.problem(401),
        "urn:dedupq:problem:unauthenticated"
    );
    assert_eq!(send(Some("globex")).await.status, 201);
    assert_eq!(
        app.status("globex", "pay-g1").await.as_deref(),
        Some("done")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_routes_answer_404_and_other_methods_405() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |_, _| {}).await;
    let nope = app.post("refunds", Some(ACME_KEY), Some("k"), BODY).await;
    assert_eq!(nope.problem(404), "urn:dedupq:problem:no-route");
    let elsewhere = Reply::from(
        client()
            .post(format!("{}/payments", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(elsewhere.problem(404), "urn:dedupq:problem:no-route");
    let get = Reply::from(client().get(app.url("payments")).send().await.unwrap()).await;
    assert_eq!(get.problem(405), "urn:dedupq:problem:method-not-allowed");
    assert_eq!(get.header("allow"), Some("POST"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transient_provider_failure_answers_503_and_the_retry_charges_once() {
    let provider = Provider::start(Knobs {
        fail_next: 1,
        ..Knobs::default()
    })
    .await;
    let app = App::with(&provider, |_, _| {}).await;
    let failed = app.pay("pay-f1", BODY).await;
    assert_eq!(
        failed.problem(503),
        "urn:dedupq:problem:handler-unavailable"
    );
    assert!(failed.retry_after() >= 1);
    // A 503 that says Retry-After pauses intake that long: the client
    // honours it.
    tokio::time::sleep(Duration::from_secs(failed.retry_after())).await;
    let retried = app.pay("pay-f1", BODY).await;
    assert_eq!(
        (retried.status, retried.replayed()),
        (201, false),
        "{retried:?}"
    );
    assert_eq!(provider.stats().await.charges, 1);
}

/// A provider that rate-limits (429, `Retry-After: 6`): its wait reaches
/// the client. The request that met the 429 and one that arrives while
/// intake is paused are both answered 503 with a `Retry-After` that ends
/// no sooner than the provider's; nothing else reaches the provider
/// meanwhile; retried once that time is up, each is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_is_relayed_as_503_with_the_providers_retry_after_and_the_retries_charge_once()
{
    const ASKED: u64 = 6;
    let provider = Provider::start(Knobs {
        answer_status: Some(429),
        answer_status_rate: 1.0,
        answer_retry_after: Some(ASKED as u32),
        ..Knobs::default()
    })
    .await;
    let app = App::with(&provider, |_, _| {}).await;
    let sent = tokio::time::Instant::now();
    let limited = app.pay("pay-r1", BODY).await;
    assert_eq!(
        limited.problem(503),
        "urn:dedupq:problem:handler-unavailable"
    );
    assert!(limited.retry_after() >= ASKED, "{limited:?}");
    let paused = app.pay("pay-r2", OTHER).await;
    assert_eq!(
        paused.problem(503),
        "urn:dedupq:problem:provider-unavailable"
    );
    // At least what is left of the provider's wait, counted from before
    // the first request was sent.
    let left = ASKED.saturating_sub(sent.elapsed().as_secs_f64().ceil() as u64);
    assert!((left..=ASKED).contains(&paused.retry_after()), "{paused:?}");
    assert_eq!(
        app.status("acme", "pay-r1").await.as_deref(),
        Some("in_progress"),
        "released (its lease ended), never stored failed"
    );

    provider
        .set_knobs(json!({ "answer_status_rate": 0.0 }))
        .await;
    // The built-in client honours Retry-After.
    tokio::time::sleep(Duration::from_secs(limited.retry_after())).await;
    for (key, body) in [("pay-r1", BODY), ("pay-r2", OTHER)] {
        let retried = app.pay(key, body).await;
        assert_eq!(retried.status, 201, "{key}: {retried:?}");
        let charges = provider.charges_for(&format!("acme:{key}")).await;
        assert_eq!(charges.len(), 1, "{key}: one charge");
    }
    assert_eq!(
        app.decided("http", "failed"),
        0,
        "a rate limit is never stored as failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_that_never_answers_gets_504_and_the_retry_with_the_same_derived_key_settles_it()
{
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let app = App::with(&provider, |_, _| {}).await;
    let timed_out = app.pay("pay-u1", BODY).await;
    assert_eq!(timed_out.problem(504), "urn:dedupq:problem:outcome-unknown");
    assert_eq!(
        app.status("acme", "pay-u1").await.as_deref(),
        Some("unknown")
    );
    let settled = app.pay("pay-u1", BODY).await;
    let charges = provider.charges_for("acme:pay-u1").await;
    assert_eq!(charges.len(), 1, "the provider recognised the derived key");
    assert_eq!(
        settled.status, 200,
        "the provider's replay, stored: {settled:?}"
    );
    assert_eq!(settled.json()["id"], format!("ch_{}", charges[0].id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_past_the_request_timeout_answers_504_and_its_outcome_is_still_stored() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(1200),
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let app = App::with(&provider, |s, _| {
        s.api.request_timeout = Duration::from_millis(300)
    })
    .await;
    let slow = app.pay("pay-s1", BODY).await;
    assert_eq!(slow.problem(504), "urn:dedupq:problem:still-running");
    crate::support::eventually(Duration::from_secs(10), "the outcome is stored", || async {
        (app.status("acme", "pay-s1").await.as_deref() == Some("done")).then_some(())
    })
    .await;
    let later = app.pay_honouring_409("pay-s1", BODY).await;
    assert_eq!((later.status, later.replayed()), (201, true), "{later:?}");
    assert_eq!(provider.stats().await.charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_requests_are_counted_in_the_same_metrics_families_with_transport_http() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |_, _| {}).await;
    app.pay("pay-m1", BODY).await;
    app.pay("pay-m1", BODY).await;
    let text = reqwest::get(format!("http://{}/metrics", app.ops))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = |outcome: &str| {
        metric_value(
            &text,
            &format!("dedupq_messages_total{{outcome=\"{outcome}\",transport=\"http\"}}"),
        )
    };
    assert_eq!((series("processed"), series("duplicate")), (1.0, 1.0));
    assert_eq!(
        metric_value(&text, "dedupq_end_to_end_seconds_count{transport=\"http\"}"),
        2.0
    );
    assert_eq!(
        metric_value(&text, "dedupq_claims_total{result=\"won\"}"),
        1.0
    );
}

/// Sends `request` as written and reads the answer until the server closes
/// the connection or goes quiet.
async fn raw(base: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .expect("connect");
    // The server may answer and close before the whole body is written.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// The test harness's own guard: another server took the API's port
/// between its choice and the application's bind (another test's
/// listener on an ephemeral port). The harness must not talk to that
/// server as if it were dedupq (an empty 404 from it failed a webhook
/// test once); it starts the application again on another port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_never_mistakes_another_server_on_the_apis_port_for_dedupq() {
    let provider = Provider::start(Knobs::default()).await;
    let squatter = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken = squatter.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        let app = axum::Router::new();
        axum::serve(squatter, app).await.unwrap();
    });
    let app = App::with(&provider, |s, _| s.api.listen = taken).await;
    assert_ne!(app.base, format!("http://{taken}"));
    let r = app.pay("squat-1", BODY).await;
    assert_eq!(r.status, 201, "{r:?}");
    serve.abort();
}
