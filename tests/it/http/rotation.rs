//! Rotating an API key or a webhook secret needs no restart: the real
//! `dedupq run` process reads the files again on SIGHUP (and when they
//! change), and a file that cannot be used keeps the credentials in force.

use super::harness::{client, scratch, wait_listening, ACME_KEY};
use crate::support::eventually;
use crate::support::isolated_store;
use crate::support::process::{base_config, free_port, Dedupq, Provider};
use dedupq_provider::Knobs;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NEW_KEY: &str = "sk_live_acme_rotated_9876543210";
const OLD_SECRET: &str = "whsec_before_rotation";
const NEW_SECRET: &str = "whsec_after_rotation";
const BODY: &str = r#"{"amount": 100, "currency": "EUR"}"#;

fn stripe_signature(secret: &str, body: &str) -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    m.update(t.as_bytes());
    m.update(b".");
    m.update(body.as_bytes());
    let mac: String = m
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={t},v1={mac}")
}

/// Whether the request got past authentication to an answer of the
/// provider's (2xx).
fn accepted(status: u16) -> bool {
    (200..300).contains(&status)
}

async fn pay(api: SocketAddr, key: &str, idempotency_key: &str) -> u16 {
    client()
        .post(format!("http://{api}/v1/payments"))
        .bearer_auth(key)
        .header("Idempotency-Key", idempotency_key)
        .body(BODY)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

async fn event(api: SocketAddr, secret: &str, id: &str) -> u16 {
    let body = format!(r#"{{"id":"{id}","type":"charge.succeeded","amount":1}}"#);
    client()
        .post(format!("http://{api}/v1/stripe"))
        .header("Stripe-Signature", stripe_signature(secret, &body))
        .body(body)
        .send()
        .await
        .expect("delivery")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_api_key_and_webhook_secret_take_effect_without_a_restart() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let dir = scratch();
    let keys = dir.join("api-keys.toml");
    std::fs::write(&keys, format!("\"{ACME_KEY}\" = \"acme\"\n")).unwrap();
    let secret = dir.join("stripe.secret");
    std::fs::write(&secret, format!("{OLD_SECRET}\n")).unwrap();
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let mut config = base_config(&store, &provider);
    let overrides: toml::Table = format!(
        r#"
[api]
enabled = true
listen = "{api}"
keys_file = "{keys}"
routes = [
  {{ name = "payments" }},
  {{ name = "stripe", webhook = "stripe", secret_file = "{secret}", tenant = "acme" }},
]
"#,
        keys = keys.display(),
        secret = secret.display(),
    )
    .parse()
    .expect("config");
    config.extend(overrides);
    let mut dedupq = Dedupq::start(&config).await;
    wait_listening(api).await;

    assert!(accepted(pay(api, ACME_KEY, "pay-1").await));
    assert_eq!(pay(api, NEW_KEY, "pay-2").await, 401);
    assert!(accepted(event(api, OLD_SECRET, "evt_1").await));
    assert_eq!(event(api, NEW_SECRET, "evt_2").await, 401);

    // The rotation: the new key and secret replace the old ones.
    std::fs::write(&keys, format!("\"{NEW_KEY}\" = \"acme\"\n")).unwrap();
    std::fs::write(&secret, format!("{NEW_SECRET}\n")).unwrap();
    dedupq.signal("-HUP");
    let mut n = 0;
    eventually(Duration::from_secs(20), "the new key is in force", || {
        n += 1;
        let key = format!("pay-new-{n}");
        async move { accepted(pay(api, NEW_KEY, &key).await).then_some(()) }
    })
    .await;
    assert!(dedupq.alive(), "SIGHUP does not stop dedupq");
    assert_eq!(
        pay(api, ACME_KEY, "pay-3").await,
        401,
        "the old key is gone"
    );
    eventually(
        Duration::from_secs(20),
        "the new secret is in force",
        || async { accepted(event(api, NEW_SECRET, "evt_3").await).then_some(()) },
    )
    .await;
    assert_eq!(event(api, OLD_SECRET, "evt_4").await, 401);

    // A broken file (half written, emptied) keeps what is in force.
    std::fs::write(&keys, "\"sk_short\" = ").unwrap();
    std::fs::write(&secret, "").unwrap();
    dedupq.signal("-HUP");
    eventually(
        Duration::from_secs(20),
        "the broken files are reported",
        || async {
            let log = dedupq.log();
            (log.contains("api.keys_file")
                && log.contains("secret_file")
                && log.contains("previous credentials stay"))
            .then_some(())
        },
    )
    .await;
    assert!(accepted(pay(api, NEW_KEY, "pay-4").await));
    assert!(accepted(event(api, NEW_SECRET, "evt_5").await));
    assert!(dedupq.alive());
}
