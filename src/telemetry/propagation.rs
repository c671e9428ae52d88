//! W3C trace context (`traceparent`, `tracestate`) in and out. What comes
//! from a broker or a client is untrusted: a malformed, repeated or
//! oversized context is ignored (the message starts a trace of its own),
//! never an error.

use crate::message::Header;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The headers that carry a trace from one process to the next.
pub const CONTEXT_HEADERS: [&str; 2] = [TRACEPARENT, TRACESTATE];

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// W3C asks to pass on at least 512 characters of `tracestate`; a longer
/// one is dropped rather than carried into every provider request.
const MAX_TRACESTATE: usize = 512;

/// The producer's span context from a delivery's headers, if it sent one
/// valid `traceparent` (with its `tracestate`, when that is usable).
pub fn remote_context(headers: &[Header]) -> Option<SpanContext> {
    let mut parents = headers.iter().filter(|h| h.is(TRACEPARENT));
    let parent = text(parents.next()?)?;
    if parents.next().is_some() || !well_formed(parent) {
        return None;
    }
    // Several tracestate headers are one list, joined in order.
    let states: Option<Vec<&str>> = headers
        .iter()
        .filter(|h| h.is(TRACESTATE))
        .map(text)
        .collect();
    let state = states
        .map(|s| s.join(","))
        .filter(|s| s.len() <= MAX_TRACESTATE);
    let carrier = Carrier { parent, state };
    let context = TraceContextPropagator::new().extract(&carrier);
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// `traceparent` and `tracestate` of an HTTP request, as the message
/// headers the engine reads them from.
pub fn context_headers(request: &HeaderMap) -> Vec<Header> {
    CONTEXT_HEADERS
        .iter()
        .flat_map(|name| {
            request
                .get_all(*name)
                .iter()
                .map(move |v| Header::new(*name, v.as_bytes()))
        })
        .collect()
}

/// Puts the current span's context on an outgoing request, replacing any
/// `traceparent`/`tracestate` already there. Returns false (and changes
/// nothing) when no span is being traced.
pub fn inject_current(request: &mut HeaderMap) -> bool {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return false;
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return false;
    }
    TraceContextPropagator::new().inject_context(&context, &mut Replacing(request));
    true
}

/// Version, trace id, span id and flags in lower-case hex, as W3C spells
/// them (the SDK's parser also takes shorter ids). Later versions may
/// append fields after a dash.
fn well_formed(parent: &str) -> bool {
    let b = parent.as_bytes();
    let hex = |range: std::ops::Range<usize>| {
        b.get(range)
            .is_some_and(|s| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
    };
    let dashes = [2, 35, 52].iter().all(|&i| b.get(i) == Some(&b'-'));
    let tail = match &b[..b.len().min(2)] {
        b"00" => b.len() == 55,
        b"ff" => false,
        _ => b.len() == 55 || b.get(55) == Some(&b'-'),
    };
    dashes && tail && hex(0..2) && hex(3..35) && hex(36..52) && hex(53..55)
}

fn text(h: &Header) -> Option<&str> {
    std::str::from_utf8(h.value.as_deref()?).ok()
}

struct Carrier<'a> {
    parent: &'a str,
    state: Option<String>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(self.parent),
            TRACESTATE => self.state.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        CONTEXT_HEADERS.to_vec()
    }
}

struct Replacing<'a>(&'a mut HeaderMap);

impl Injector for Replacing<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = HeaderName::try_from(key) else {
            return;
        };
        match HeaderValue::try_from(value) {
            Ok(v) if !v.is_empty() => {
                self.0.insert(name, v);
            }
            // An empty tracestate is left out, as W3C recommends.
            _ => {
                self.0.remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &[u8])]) -> Vec<Header> {
        pairs.iter().map(|(n, v)| Header::new(*n, *v)).collect()
    }

    #[test]
    fn a_valid_traceparent_gives_the_producers_span_and_tracestate() {
        let got = remote_context(&headers(&[
            ("TraceParent", PARENT.as_bytes()),
            ("tracestate", b"vendor=a"),
            ("tracestate", b"other=b"),
        ]))
        .expect("a context");
        assert_eq!(
            got.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(got.span_id().to_string(), "00f067aa0ba902b7");
        assert!(got.is_sampled() && got.is_remote());
        assert_eq!(got.trace_state().header(), "vendor=a,other=b");
    }

    #[test]
    fn malformed_repeated_or_hostile_contexts_are_ignored() {
        let cases: Vec<Vec<Header>> = vec![
            headers(&[("traceparent", b"00-1-1-01")]),
            headers(&[("traceparent", PARENT.to_uppercase().as_bytes())]),
            headers(&[("traceparent", &PARENT.as_bytes()[..54])]),
            headers(&[("traceparent", format!("{PARENT}-x").as_bytes())]),
            headers(&[(
                "traceparent",
                b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            )]),
            headers(&[("traceparent", b"\xff\xfe")]),
            headers(&[
                ("traceparent", PARENT.as_bytes()),
                ("traceparent", PARENT.as_bytes()),
            ]),
            vec![Header {
                name: b"traceparent".to_vec(),
                value: None,
            }],
        ];
        for (i, case) in cases.iter().enumerate() {
            assert!(remote_context(case).is_none(), "case {i} was accepted");
        }
    }

    #[test]
    fn a_later_version_with_more_fields_is_read_and_an_oversized_tracestate_dropped() {
        let later = PARENT.replacen("00", "01", 1) + "-future";
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE));
        let got = remote_context(&headers(&[
            ("traceparent", later.as_bytes()),
            ("tracestate", long.as_bytes()),
        ]))
        .expect("a context");
        assert_eq!(got.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(got.trace_state().header(), "");
    }

    #[test]
    fn an_http_requests_context_headers_become_message_headers() {
        let mut request = HeaderMap::new();
        request.insert("traceparent", HeaderValue::from_static(PARENT));
        request.insert("tracestate", HeaderValue::from_static("a=b"));
        request.insert("client-id", HeaderValue::from_static("mallory"));
        let got = context_headers(&request);
        assert_eq!(got.len(), 2);
        assert!(remote_context(&got).is_some());
    }

    #[test]
    fn without_a_traced_span_nothing_is_injected() {
        let mut request = HeaderMap::new();
        request.insert("traceparent", HeaderValue::from_static(PARENT));
        assert!(!inject_current(&mut request));
        assert_eq!(request["traceparent"], PARENT, "the passed header stays");
    }
}
