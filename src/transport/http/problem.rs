//! Errors as `application/problem+json` (RFC 9457): a type URI naming the
//! problem, a title, the status and a detail for this occurrence.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

pub(super) const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug)]
pub(super) struct Problem {
    pub status: StatusCode,
    /// The last part of the type URI `urn:dedupq:problem:<slug>`.
    pub slug: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub retry_after: Option<Duration>,
    /// One more header (e.g. `WWW-Authenticate`).
    pub header: Option<(HeaderName, HeaderValue)>,
}

impl Problem {
    pub(super) fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
            header: None,
        }
    }

    pub(super) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(super) fn with_header(mut self, name: HeaderName, value: &'static str) -> Self {
        self.header = Some((name, HeaderValue::from_static(value)));
        self
    }
}

/// Whole seconds, rounded up, at least 1 (`Retry-After` takes seconds).
pub(super) fn retry_after_secs(after: Duration) -> u64 {
    (after.as_secs_f64().ceil() as u64).max(1)
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = json!({
            "type": format!("urn:dedupq:problem:{}", self.slug),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, PROBLEM_JSON)],
            body.to_string(),
        )
            .into_response();
        let headers = response.headers_mut();
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, retry_after_secs(after).into());
        }
        if let Some((name, value)) = self.header {
            headers.insert(name, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(200)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }
}
