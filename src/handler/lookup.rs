//! `handler.lookup_url`: before a key whose earlier attempt may have
//! charged is sent again, the provider is asked whether that attempt took
//! effect. A found charge settles the key `done` without a second request.

use super::{HandlerCall, HandlerOutcome, HandlerResult};
use crate::config::HandlerSettings;
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{Response, StatusCode};
use std::time::Duration;

/// The lookup of `handler.lookup_url`, asked through the handler's own
/// client (its TLS settings and pool) with its static headers.
pub(super) struct Lookup {
    client: reqwest::Client,
    template: String,
    timeout: Duration,
    headers: HeaderMap,
    max_response_bytes: usize,
}

impl Lookup {
    /// None while `handler.lookup_url` is not set.
    pub(super) fn new(
        s: &HandlerSettings,
        client: &reqwest::Client,
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
            Ok(r) if r.status() == StatusCode::OK => {
                let result = read(r, self.max_response_bytes).await.ok()?;
                tracing::info!(identity = %call.identity, "lookup found the charge; settling the key");
                Some(HandlerOutcome::Success(result))
            }
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

    /// `GET` of the lookup URL with `{derived_key}` replaced by `key`,
    /// URL-encoded.
    async fn get(&self, key: &str) -> reqwest::Result<Response> {
        let encoded: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        self.client
            .get(self.template.replace("{derived_key}", &encoded))
            .timeout(self.timeout)
            .headers(self.headers.clone())
            .send()
            .await
    }
}

/// The answer's status and body; a body longer than `limit` is dropped.
async fn read(mut response: Response, limit: usize) -> Result<HandlerResult, reqwest::Error> {
    let status = i32::from(response.status().as_u16());
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > limit {
            tracing::warn!(
                status,
                limit,
                "lookup answer too long; its body is not kept"
            );
            return Ok(HandlerResult {
                status,
                body: Vec::new(),
                content_type: None,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(HandlerResult {
        status,
        body,
        content_type,
    })
}
