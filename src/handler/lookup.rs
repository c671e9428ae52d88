//! `handler.lookup_url`: before a key whose earlier attempt may have
//! charged is sent again, the provider is asked whether that attempt took
//! effect. A found charge settles the key `done` without a second request.
//!
//! Found means a 200 that names the derived key: its body is JSON holding
//! the key as a string value, at any depth (a member's value or an array
//! element, e.g. `"idempotency_key": "acme:pay-1"`; a member's name does
//! not count). A 200 for every key (a URL one path segment off, such as a
//! listing answering an empty list) would otherwise record payments that
//! were never made. Any other answer finds nothing: the request is sent
//! again with the same derived key, and the provider's idempotency decides.
//!
//! At start-up the lookup is asked once for a key that was never charged:
//! a 200 (whatever its body) shows it does not look charges up by key, and
//! dedupq refuses to start. A lookup that cannot be reached then does not
//! stop start-up: the provider may be down for a moment.

use super::client::SharedClient;
use super::http::read_answer;
use super::{HandlerCall, HandlerOutcome, HandlerResult, HttpHandler, HttpHandlerError};
use crate::config::HandlerSettings;
use reqwest::header::HeaderMap;
use reqwest::{Response, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// The lookup of `handler.lookup_url`, asked through the handler's own
/// client (its TLS settings and pool) with its static headers.
pub(super) struct Lookup {
    client: SharedClient,
    template: String,
    timeout: Duration,
    headers: HeaderMap,
    max_response_bytes: usize,
}

impl Lookup {
    /// None while `handler.lookup_url` is not set.
    pub(super) fn new(
        s: &HandlerSettings,
        client: &SharedClient,
        headers: &HeaderMap,
    ) -> Option<Self> {
        Some(Self {
            client: client.clone(),
            template: s.lookup_url.clone()?,
            timeout: s.timeout,
            headers: headers.clone(),
            max_response_bytes: s.max_response_bytes,
        })
    }

    /// Asks the provider whether the uncertain attempt charged. Some(done)
    /// settles the key; None: unknown or not found, send the request.
    pub(super) async fn ask(&self, call: &HandlerCall<'_>) -> Option<HandlerOutcome> {
        match self.get(call.derived_key).await {
            Ok(r) if r.status() == StatusCode::OK => match read(r, self.max_response_bytes).await {
                Ok(Some(result)) if names_key(&result.body, call.derived_key) => {
                    tracing::info!(identity = %call.identity, "lookup found the charge; settling the key");
                    Some(HandlerOutcome::Success(result))
                }
                Ok(_) => {
                    tracing::warn!(identity = %call.identity, "lookup fault: a 200 that does not name the derived key is no charge found (check handler.lookup_url); sending the request again");
                    None
                }
                Err(e) => {
                    tracing::warn!(identity = %call.identity, error = %e.without_url(), "lookup answer broke off; sending the request again");
                    None
                }
            },
            Ok(r) => {
                tracing::info!(identity = %call.identity, status = %r.status(), "lookup found no charge; sending the request again");
                None
            }
            Err(e) => {
                tracing::warn!(identity = %call.identity, error = %e.without_url(), "lookup failed; sending the request again");
                None
            }
        }
    }

    /// Asks for a key that cannot have been charged; a 200 is refused.
    async fn probe(&self) -> Result<(), HttpHandlerError> {
        let key = format!("dedupq-probe-{:032x}", rand::random::<u128>());
        match self.get(&key).await {
            Ok(r) if r.status() == StatusCode::OK => Err(HttpHandlerError::Config {
                setting: "lookup_url",
                problem: format!(
                    "answers 200 for a key that was never charged ({key}): it does not look \
                     charges up by key. Fix: point it at the provider's lookup of one charge, \
                     with {{derived_key}} where the key goes"
                ),
            }),
            Ok(r) => {
                tracing::info!(status = %r.status(), "handler.lookup_url finds no charge for a key never used");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e.without_url(), "handler.lookup_url could not be checked (no answer); starting anyway");
                Ok(())
            }
        }
    }

    /// The lookup URL for a key never charged, if it parses.
    pub(super) fn probe_url(&self) -> Option<reqwest::Url> {
        reqwest::Url::parse(&self.template.replace("{derived_key}", "dedupq-check")).ok()
    }

    /// `GET` of the lookup URL with `{derived_key}` replaced by `key`,
    /// URL-encoded.
    async fn get(&self, key: &str) -> reqwest::Result<Response> {
        let encoded: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        self.client
            .get()
            .get(self.template.replace("{derived_key}", &encoded))
            .timeout(self.timeout)
            .headers(self.headers.clone())
            .send()
            .await
    }
}

impl HttpHandler {
    /// Asks `handler.lookup_url` (if set) once for a key that was never
    /// charged: Err if it answers 200. Unreachable or any other status:
    /// Ok. [`from_settings`](super::from_settings) calls it at start-up.
    pub async fn check_lookup(&self) -> Result<(), HttpHandlerError> {
        match &self.lookup {
            Some(lookup) => lookup.probe().await,
            None => Ok(()),
        }
    }
}

/// Whether `body` is JSON holding `key` as a string value, at any depth.
fn names_key(body: &[u8], key: &str) -> bool {
    fn holds(value: &Value, key: &str) -> bool {
        match value {
            Value::String(s) => s == key,
            Value::Array(items) => items.iter().any(|v| holds(v, key)),
            Value::Object(members) => members.values().any(|v| holds(v, key)),
            _ => false,
        }
    }
    serde_json::from_slice::<Value>(body).is_ok_and(|v| holds(&v, key))
}

/// The answer's status and body; None if the body is longer than `limit`
/// (it could not be stored, so it cannot settle the key).
async fn read(response: Response, limit: usize) -> Result<Option<HandlerResult>, reqwest::Error> {
    let status = response.status().as_u16();
    let answer = read_answer(response, limit).await?;
    if answer.is_none() {
        tracing::warn!(status, limit, "lookup answer too long to store");
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::names_key;

    #[test]
    fn only_a_json_body_holding_the_derived_key_as_a_string_names_it() {
        let key = "acme:pay-1";
        for (body, named) in [
            (r#"{"id":"ch_1","idempotency_key":"acme:pay-1"}"#, true),
            (r#"{"charges":[{"key":"acme:pay-1"}]}"#, true),
            (r#"["acme:pay-1"]"#, true),
            (r#"{"count":0,"charges":[]}"#, false),
            (r#"{"idempotency_key":"acme:pay-2"}"#, false),
            (r#"{"idempotency_key":"acme:pay-10"}"#, false),
            (r#"{"idempotency_key":"ACME:PAY-1"}"#, false),
            (r#"{"acme:pay-1":true}"#, false),
            ("acme:pay-1", false),
            ("", false),
        ] {
            assert_eq!(names_key(body.as_bytes(), key), named, "{body}");
        }
    }
}
