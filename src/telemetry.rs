//! Logging: readable text by default, JSON on request.

use crate::config::{LogFormat, LogSettings};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are ignored (tests).
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_env("DEDUPQ_LOG")
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match settings.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// An error with its causes, on one line: `outer: cause: cause`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
