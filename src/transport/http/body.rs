//! Reading a request body whole, refused as soon as it passes the limit.

use super::problem::Problem;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use futures::StreamExt;

#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the body could not be read: {0}")]
    Read(#[source] axum::Error),
}

impl From<BodyError> for Problem {
    fn from(e: BodyError) -> Self {
        let status = match e {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        };
        Problem::new(
            status,
            "invalid-request",
            "The request is invalid; nothing was done",
            e.to_string(),
        )
    }
}

/// The whole body, refused as soon as it passes `limit` (a declared
/// length already over it is refused before reading).
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Read)?;
        if buf.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}
