//! The provider simulator's endpoints beyond `process::Provider`'s own:
//! raw charge requests, the lookup, forgetting keys, per-key counts.

use super::process::Provider;
use dedupq_provider::KeyCharges;
use std::time::Duration;

/// A client that never follows redirects, as dedupq's must not.
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

impl Provider {
    /// `POST /charges` with exactly these bytes and content type.
    pub async fn post_raw(&self, key: &str, content_type: &str, body: &[u8]) -> reqwest::Response {
        no_redirects()
            .post(self.charges_url())
            .header("idempotency-key", key)
            .header("content-type", content_type)
            .body(body.to_vec())
            .send()
            .await
            .expect("POST /charges")
    }

    /// `GET /charges/lookup?key=…`: what a retry with `key` would get.
    pub async fn lookup(&self, key: &str) -> reqwest::Response {
        no_redirects()
            .get(format!("{}/charges/lookup", self.base))
            .query(&[("key", key)])
            .send()
            .await
            .expect("GET /charges/lookup")
    }

    /// `POST /admin/forget-keys`; returns how many charges it forgot.
    pub async fn forget_keys(&self) -> u64 {
        let v: serde_json::Value = no_redirects()
            .post(format!("{}/admin/forget-keys", self.base))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("POST /admin/forget-keys")
            .json()
            .await
            .expect("JSON");
        v["forgotten"].as_u64().expect("a count")
    }

    /// `GET /stats/keys`: each idempotency key with its charges.
    pub async fn key_charges(&self, tenant: Option<&str>) -> Vec<KeyCharges> {
        let mut request = no_redirects().get(format!("{}/stats/keys", self.base));
        if let Some(t) = tenant {
            request = request.query(&[("tenant", t)]);
        }
        request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("GET /stats/keys")
            .json()
            .await
            .expect("JSON")
    }

    /// `POST /admin/knobs`, returning the answer instead of expecting success.
    pub async fn try_knobs(&self, patch: serde_json::Value) -> reqwest::Response {
        no_redirects()
            .post(format!("{}/admin/knobs", self.base))
            .json(&patch)
            .send()
            .await
            .expect("POST /admin/knobs")
    }
}
