//! Whether the provider can be reached, without charging anything: a
//! `HEAD` of each target URL (safe by HTTP's definition, and refused by
//! charge endpoints that take only POST, which still proves the route,
//! the TLS handshake and the credentials): for `dedupq check`.

use super::HttpHandler;
use reqwest::StatusCode;

/// One target URL and what its `HEAD` met.
#[derive(Debug)]
pub struct Reached {
    /// `handler.url`, `handler.routes`, or `handler.lookup_url`.
    pub setting: &'static str,
    /// The URL with any password hidden.
    pub url: String,
    /// The status answered, or why no answer came (connection refused, a
    /// certificate the CA does not sign, a timeout).
    pub answer: Result<StatusCode, String>,
}

impl HttpHandler {
    /// `HEAD` of `handler.url`, of every route's URL and of the lookup
    /// URL, with the handler's client (its CA, client identity and static
    /// headers such as Authorization), redirects not followed.
    pub async fn reach(&self) -> Vec<Reached> {
        let mut targets = vec![("handler.url", self.url.clone())];
        targets.extend(
            self.routes
                .iter()
                .map(|(_, url)| ("handler.routes", url.clone())),
        );
        if let Some(lookup) = self.lookup.as_ref().and_then(|l| l.probe_url()) {
            targets.push(("handler.lookup_url", lookup));
        }
        let mut reached = Vec::new();
        for (setting, url) in targets {
            let answer = self
                .client
                .get()
                .head(url.clone())
                .timeout(self.timeout)
                .headers(self.static_headers.clone())
                .send()
                .await
                .map(|r| r.status())
                .map_err(|e| crate::telemetry::chain(&e.without_url()).to_string());
            reached.push(Reached {
                setting,
                url: crate::config::redact_url(url.as_str()),
                answer,
            });
        }
        reached
    }
}
