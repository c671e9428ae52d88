//! Webhook routes: the key is the sender's event id, the signature is
//! checked before anything is claimed.

use super::harness::{client, secret_file, App, Reply};
use crate::support::count_rows;
use crate::support::process::Provider;
use dedupq::config::RouteSettings;
use dedupq_provider::Knobs;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const STRIPE_SECRET: &str = "whsec_test_5f3c2a1b";
const GITHUB_SECRET: &str = "gh-hook-secret";
const GENERIC_SECRET: &str = "generic-hook-secret";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(secret: &str, parts: &[&[u8]]) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    for p in parts {
        m.update(p);
    }
    hex(&m.finalize().into_bytes())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `t=<t>,v1=<HMAC of "<t>.<body>">`, as Stripe signs.
fn stripe_signature(t: u64, body: &str) -> String {
    let t = t.to_string();
    format!(
        "t={t},v1={}",
        mac(STRIPE_SECRET, &[t.as_bytes(), b".", body.as_bytes()])
    )
}

fn routes(dir: &Path) -> Vec<RouteSettings> {
    let text = format!(
        r#"
[[routes]]
name = "stripe"
webhook = "stripe"
secret_file = "{stripe}"
tenant = "acme"

[[routes]]
name = "github"
webhook = "github"
secret_file = "{github}"
tenant = "acme"

[[routes]]
name = "events"
webhook = "hmac"
signature_header = "X-Signature"
key_header = "X-Event-Id"
secret_file = "{generic}"
tenant = "acme"
"#,
        stripe = secret_file(dir, "stripe.secret", STRIPE_SECRET).display(),
        github = secret_file(dir, "github.secret", GITHUB_SECRET).display(),
        generic = secret_file(dir, "generic.secret", GENERIC_SECRET).display(),
    );
    #[derive(serde::Deserialize)]
    struct Routes {
        routes: Vec<RouteSettings>,
    }
    toml::from_str::<Routes>(&text)
        .expect("webhook routes")
        .routes
}

async fn start(provider: &Provider) -> App {
    App::with(provider, |s, dir| {
        // Webhook routes only: no API keys needed.
        s.api.keys_file = None;
        s.api.routes = routes(dir);
        // Room for a busy machine: a concurrent delivery must arrive while
        // the first one's provider call still runs.
        s.handler.timeout = Duration::from_secs(10);
        s.engine.lease = Duration::from_secs(15);
        s.engine.renew_every = Duration::from_secs(3);
    })
    .await
}

async fn deliver(app: &App, route: &str, headers: &[(&str, String)], body: &str) -> Reply {
    let mut request = client().post(app.url(route)).body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    Reply::from(request.send().await.expect("delivery")).await
}

const EVENT: &str =
    r#"{"id":"evt_1NZ","type":"payment_intent.succeeded","amount":100,"currency":"eur"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signed_stripe_event_delivered_three_times_two_at_once_is_processed_once() {
    // Charges every call: a second execution would show as a second charge.
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(3),
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let app = start(&provider).await;
    let signed = || vec![("Stripe-Signature", stripe_signature(now(), EVENT))];

    let (one, two) = (signed(), signed());
    let (a, b) = tokio::join!(
        deliver(&app, "stripe", &one, EVENT),
        deliver(&app, "stripe", &two, EVENT)
    );
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [201, 409], "{a:?}\n{b:?}");
    let third = deliver(&app, "stripe", &signed(), EVENT).await;
    assert_eq!((third.status, third.replayed()), (201, true), "{third:?}");

    assert_eq!(provider.stats().await.charges, 1, "processed once");
    let charges = provider.charges_for("acme:webhook/stripe/evt_1NZ").await;
    assert_eq!(
        charges.len(),
        1,
        "keyed by the event id under the route's tenant"
    );
    assert_eq!(app.decided("http", "processed"), 1);
    assert_eq!(app.decided("http", "duplicate"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tampered_body_or_an_expired_timestamp_answers_401_and_leaves_no_key() {
    let provider = Provider::start(Knobs::default()).await;
    let app = start(&provider).await;

    let tampered = EVENT.replace("100", "10000");
    let signed_original = vec![("Stripe-Signature", stripe_signature(now(), EVENT))];
    let r = deliver(&app, "stripe", &signed_original, &tampered).await;
    assert_eq!(r.problem(401), "urn:dedupq:problem:bad-signature");

    let ten_minutes_ago = vec![("Stripe-Signature", stripe_signature(now() - 600, EVENT))];
    let r = deliver(&app, "stripe", &ten_minutes_ago, EVENT).await;
    assert_eq!(r.problem(401), "urn:dedupq:problem:bad-signature");
    assert!(
        r.json()["detail"].as_str().unwrap().contains("timestamp"),
        "{r:?}"
    );

    let r = deliver(&app, "stripe", &[], EVENT).await;
    assert_eq!(r.problem(401), "urn:dedupq:problem:bad-signature");

    assert_eq!(count_rows(&app.store).await, 0, "nothing claimed");
    assert_eq!(provider.stats().await.charges, 0);

    // The same event, correctly signed, goes through.
    let r = deliver(&app, "stripe", &signed_original, EVENT).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(count_rows(&app.store).await, 1);
}

/// The key a sender that does not sign its event id is claimed under:
/// the signed body's SHA-256, in the route's namespace.
fn body_key(route: &str, body: &str) -> String {
    use sha2::Digest;
    format!(
        "acme:webhook/{route}/sha256:{}",
        hex(&Sha256::digest(body.as_bytes()))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn github_and_generic_hmac_webhooks_are_verified_and_a_captured_delivery_replayed_under_a_new_id_is_a_duplicate(
) {
    let provider = Provider::start(Knobs {
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let app = start(&provider).await;
    let push = r#"{"ref":"refs/heads/main","amount":1}"#;
    let github = |secret: &str, delivery: &str| {
        vec![
            ("X-GitHub-Delivery", delivery.to_string()),
            (
                "X-Hub-Signature-256",
                format!("sha256={}", mac(secret, &[push.as_bytes()])),
            ),
        ]
    };
    let id = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    assert_eq!(
        deliver(&app, "github", &github("wrong", id), push)
            .await
            .problem(401),
        "urn:dedupq:problem:bad-signature"
    );
    let first = deliver(&app, "github", &github(GITHUB_SECRET, id), push).await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let redelivered = deliver(&app, "github", &github(GITHUB_SECRET, id), push).await;
    assert_eq!((redelivered.status, redelivered.replayed()), (201, true));
    // The delivery id header is not signed: a captured delivery replayed
    // with a fresh one is the same signed body, so the same key.
    let replayed = deliver(
        &app,
        "github",
        &github(GITHUB_SECRET, "00000000-0000-0000-0000-000000000001"),
        push,
    )
    .await;
    assert_eq!(
        (replayed.status, replayed.replayed()),
        (201, true),
        "{replayed:?}"
    );
    assert_eq!(
        provider.charges_for(&body_key("github", push)).await.len(),
        1
    );

    let event = r#"{"kind":"invoice.paid","amount":7}"#;
    let generic = |event_id: &str| {
        vec![
            ("X-Event-Id", event_id.to_string()),
            (
                "X-Signature",
                format!("sha256={}", mac(GENERIC_SECRET, &[event.as_bytes()])),
            ),
        ]
    };
    assert_eq!(
        deliver(&app, "events", &generic("inv-7"), event)
            .await
            .status,
        201
    );
    assert_eq!(
        deliver(&app, "events", &generic("inv-7"), event)
            .await
            .status,
        201
    );
    let replayed = deliver(&app, "events", &generic("inv-7b"), event).await;
    assert_eq!((replayed.status, replayed.replayed()), (201, true));
    assert_eq!(
        provider.charges_for(&body_key("events", event)).await.len(),
        1
    );
    assert_eq!(provider.stats().await.charges, 2, "one per signed body");
    let unsigned = vec![("X-Event-Id", "inv-8".to_string())];
    assert_eq!(
        deliver(&app, "events", &unsigned, event).await.problem(401),
        "urn:dedupq:problem:bad-signature"
    );
}

/// An API caller of the webhook's tenant sends a Stripe event id (seen in
/// a dashboard) as its own `Idempotency-Key` on `/v1/payments` first. The
/// signed deliveries of that event still run: webhook routes keep their
/// event ids in a namespace of their own, which API keys may not enter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_caller_using_a_webhook_event_id_as_its_key_never_blocks_the_signed_deliveries() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |s, dir| {
        s.api.routes.extend(routes(dir));
    })
    .await;
    let by_caller = app
        .pay("evt_1NZ", r#"{"amount": 5, "currency": "EUR"}"#)
        .await;
    assert_eq!(by_caller.status, 201, "{by_caller:?}");

    for n in 1..=3 {
        let signed = vec![("Stripe-Signature", stripe_signature(now(), EVENT))];
        let r = deliver(&app, "stripe", &signed, EVENT).await;
        assert_eq!(r.status, 201, "delivery {n}: {r:?}");
        assert_eq!(r.replayed(), n > 1, "delivery {n}: {r:?}");
    }
    assert_eq!(
        provider.stats().await.charges,
        2,
        "the caller's and the event's"
    );

    let squatting = app
        .pay(
            "webhook/stripe/evt_2",
            r#"{"amount": 5, "currency": "EUR"}"#,
        )
        .await;
    assert_eq!(
        squatting.problem(400),
        "urn:dedupq:problem:invalid-key",
        "the webhooks' namespace is theirs"
    );
}
