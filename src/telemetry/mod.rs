//! Logs and traces. Logs: readable text by default, JSON on request (a
//! line inside an exported span carries its `trace_id` and `span_id`),
//! errors with their causes. Traces (`[telemetry]`, off by default): a span
//! per batch and per message, continued from the message's W3C
//! `traceparent` and sent on to the provider, exported over OTLP.
//!
//! dedupq's spans and span events use the target [`TARGET`]: they go to the
//! exporter only, never into the logs, and with export off no layer wants
//! them, so the macros that make them return at once.

mod chain;
mod export;
mod propagation;
pub mod spans;
mod trace_ids;

pub use chain::{chain, Chain};
pub use export::ExportError;
pub use propagation::{context_headers, inject_current, remote_context, CONTEXT_HEADERS};

use crate::config::{LogFormat, LogSettings, TelemetrySettings};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::IsTerminal;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, Layer};

/// The target of every span and span event dedupq makes for traces.
pub const TARGET: &str = "dedupq::trace";

/// The installed exporter, if any; flush it with [`Telemetry::shutdown`]
/// before the process exits, or the last spans are lost.
#[must_use = "call shutdown() before exiting to flush the last spans"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber for logs only, once (later calls are
/// ignored: tests).
pub fn init(log: &LogSettings) {
    // Without an exporter nothing can fail.
    let _ = init_with_traces(log, None);
}

/// Installs the global subscriber once (later calls are ignored: tests):
/// the log output, and with `traces` enabled the OTLP exporter. An error
/// names the setting that stops start-up.
pub fn init_with_traces(
    log: &LogSettings,
    traces: Option<&TelemetrySettings>,
) -> Result<Telemetry, ExportError> {
    let provider = match traces.filter(|t| t.enabled) {
        Some(settings) => Some(export::tracer_provider(settings)?),
        None => None,
    };
    spans::set_exporting(provider.is_some());
    let filter = EnvFilter::try_from_env("DEDUPQ_LOG")
        .or_else(|_| EnvFilter::try_new(&log.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Trace spans never reach the log: a log line stays the same whether
    // tracing is on or off.
    let logged = filter.and(filter_fn(|meta| meta.target() != TARGET));
    let logs = fmt::layer()
        .with_writer(std::io::stderr)
        // Colour codes are for people at a terminal; in a file, a pipe or a
        // log collector they are noise that breaks grep and parsers.
        .with_ansi(std::io::stderr().is_terminal());
    let logs = match log.format {
        LogFormat::Text => logs.with_filter(logged).boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .map_event_format(trace_ids::WithTraceIds)
            .with_filter(logged)
            .boxed(),
    };
    let traces = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("dedupq"))
            // Spent per span on every message: what traces do not need.
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_target(false)
            .with_level(false)
            // dedupq's spans, and its warnings and errors as events of the
            // span they happen in.
            .with_filter(
                Targets::new()
                    .with_target(TARGET, LevelFilter::TRACE)
                    .with_target("dedupq", LevelFilter::WARN),
            )
    });
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    Ok(Telemetry { provider })
}

impl Telemetry {
    /// Exports what is still buffered and stops the exporter (bounded by
    /// `telemetry.export_timeout`).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The SDK blocks while it flushes; the exporter itself needs this
        // runtime's other threads meanwhile.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = flushed {
            eprintln!("dedupq: flushing traces failed: {e}");
        }
    }
}
