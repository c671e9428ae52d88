//! JSON log lines inside an exported span carry its `trace_id` and
//! `span_id`, so a log collector can join a line to its trace. The ids are
//! those of the OpenTelemetry span context (what reaches the collector);
//! without an exporter, or outside a span, the line is left as it is.

use opentelemetry::trace::{SpanId, TraceContextExt, TraceId};
use std::fmt;
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps the JSON event format: the line it writes, with the two ids added
/// as the last members of its object.
pub(super) struct WithTraceIds<F>(pub(super) F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_ids() else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&with_ids(&line, trace_id, span_id))
    }
}

/// The ids of the current span's OpenTelemetry context, if it has a valid
/// one (only spans the exporter's layer follows do).
fn current_ids() -> Option<(TraceId, SpanId)> {
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let context = cx.span().span_context().clone();
    context
        .is_valid()
        .then(|| (context.trace_id(), context.span_id()))
}

/// `line` (one JSON object and a line break) with the ids as its last
/// members; a line that is not an object is left as it is.
fn with_ids(line: &str, trace_id: TraceId, span_id: SpanId) -> String {
    let body = line.trim_end();
    let Some(open) = body.strip_suffix('}') else {
        return line.to_string();
    };
    let comma = if open.trim_end().ends_with('{') {
        ""
    } else {
        ","
    };
    format!("{open}{comma}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (TraceId, SpanId) {
        (
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        )
    }

    #[test]
    fn the_ids_are_added_after_every_existing_member() {
        let (t, s) = ids();
        let line = "{\"timestamp\":\"x\",\"level\":\"INFO\",\"message\":\"m\"}\n";
        let out = with_ids(line, t, s);
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed["span_id"], "00f067aa0ba902b7");
        assert_eq!(parsed["message"], "m");
        assert_eq!(parsed["level"], "INFO");
        assert!(out.ends_with("}\n"), "{out}");
    }

    #[test]
    fn an_empty_object_gets_the_ids_alone_and_other_text_is_kept() {
        let (t, s) = ids();
        let out = with_ids("{}\n", t, s);
        serde_json::from_str::<serde_json::Value>(&out).expect("valid JSON");
        assert_eq!(with_ids("not json\n", t, s), "not json\n");
    }
}
