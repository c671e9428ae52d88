//! The engine's spans. `dedupq.batch` covers one call of the engine (its
//! claim and finish statements are `dedupq.claim` and `dedupq.finish`
//! inside it); `dedupq.message` covers one message from parse to decision,
//! a child of the producer's span when the message carries a
//! `traceparent`; `dedupq.handler` is the handler call inside it, whose
//! context the HTTP handler sends to the provider.
//!
//! A batch belongs to one trace when every traced message in it does (the
//! batch span is then a child of the first one's producer span); otherwise
//! it starts a trace of its own and links each producer span. A message
//! without a `traceparent` is a child of a batch that started its own
//! trace, or else starts one itself; every other message span links its
//! batch span.
//!
//! The helpers take deliveries, identities and labels, never the engine's
//! types: the engine calls telemetry, not the other way round.

use super::{propagation::remote_context, TARGET};
use crate::identity::{Epoch, Identity};
use crate::message::Incoming;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::field::Empty;
use tracing::{Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A span of this many links at most: the SDK keeps 128 per span.
const MAX_LINKS: usize = 128;

/// Whether an exporter is installed ([`super::init_with_traces`]). Without
/// one, no span is made at all: the subscriber would still make and
/// record each one in its registry (the log layer refuses them, but the
/// absent exporter layer asks for every callsite), once per batch, message,
/// statement and handler call, for nobody.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Marks traces as exported from now on (or not). `init_with_traces`
/// sets it; an embedder or a test that installs a subscriber of its own
/// which wants dedupq's spans sets it too.
pub fn set_exporting(on: bool) {
    EXPORTING.store(on, Ordering::Relaxed);
}

fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The spans of one engine call: the batch, and one per message.
pub struct BatchTrace {
    batch: Span,
    messages: Vec<Span>,
}

impl BatchTrace {
    /// Opens the batch span and one span per message, parented and linked
    /// as the module documentation says (all disabled when tracing is off).
    pub fn open(batch: &[Incoming]) -> Self {
        if !exporting() {
            return Self {
                batch: Span::none(),
                messages: vec![Span::none(); batch.len()],
            };
        }
        let transport = batch
            .first()
            .map_or("none", |m| m.source.transport().label());
        let span = tracing::info_span!(target: TARGET, parent: None, "dedupq.batch",
            otel.kind = "consumer", transport, size = batch.len());
        if span.is_disabled() {
            return Self {
                batch: span,
                messages: vec![Span::none(); batch.len()],
            };
        }
        let remotes: Vec<Option<SpanContext>> =
            batch.iter().map(|m| remote_context(&m.headers)).collect();
        let mut traced = remotes.iter().flatten();
        let first = traced.clone().next();
        let one_trace = first.filter(|f| traced.all(|r| r.trace_id() == f.trace_id()));
        match one_trace {
            Some(parent) => {
                let _ = span.set_parent(remote(parent));
            }
            None => {
                for link in remotes.iter().flatten().take(MAX_LINKS) {
                    span.add_link(link.clone());
                }
            }
        }
        let own_trace = one_trace.is_none();
        let batch_context = span.context().span().span_context().clone();
        let messages = batch
            .iter()
            .zip(&remotes)
            .map(|(msg, producer)| {
                let in_batch = own_trace && producer.is_none();
                let m = message_span(msg, in_batch.then_some(&span));
                if let Some(producer) = producer {
                    let _ = m.set_parent(remote(producer));
                }
                if !in_batch {
                    m.add_link(batch_context.clone());
                }
                m
            })
            .collect();
        Self {
            batch: span,
            messages,
        }
    }

    /// The batch span.
    pub fn span(&self) -> &Span {
        &self.batch
    }

    /// The span of the message at `index` of the batch.
    pub fn message(&self, index: usize) -> &Span {
        &self.messages[index]
    }

    /// Records what was decided about the message at `index` on its span:
    /// its tenant and key and the claim's epoch where known, and the
    /// `outcome` label.
    pub fn decided(
        &self,
        index: usize,
        identity: Option<&Identity>,
        epoch: Option<Epoch>,
        outcome: &'static str,
    ) {
        let span = &self.messages[index];
        if span.is_disabled() {
            return;
        }
        if let Some(identity) = identity {
            span.record("tenant", identity.tenant.as_str());
            span.record("key", identity.key.as_str());
        }
        if let Some(epoch) = epoch {
            span.record("epoch", epoch.0);
        }
        span.record("outcome", outcome);
    }
}

fn message_span(msg: &Incoming, parent: Option<&Span>) -> Span {
    let transport = msg.source.transport().label();
    match parent {
        Some(batch) => tracing::info_span!(target: TARGET, parent: batch, "dedupq.message",
            otel.kind = "consumer", transport, source = %msg.source,
            tenant = Empty, key = Empty, epoch = Empty, outcome = Empty),
        None => tracing::info_span!(target: TARGET, parent: None, "dedupq.message",
            otel.kind = "consumer", transport, source = %msg.source,
            tenant = Empty, key = Empty, epoch = Empty, outcome = Empty),
    }
}

fn remote(producer: &SpanContext) -> Context {
    Context::new().with_remote_span_context(producer.clone())
}

/// The claim statement of a round (inside the batch span).
pub fn claim(messages: usize) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "dedupq.claim", messages)
}

/// The statement storing finished handlers' outcomes (inside the batch span).
pub fn finish(rows: usize) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "dedupq.finish", rows)
}

/// What the claim said about one message, as an event of its span.
pub fn claimed(message: &Span, result: &'static str) {
    tracing::event!(target: TARGET, parent: message, Level::INFO, claim = result, "claimed");
}

/// Whether one message's outcome was stored, as an event of its span.
pub fn stored(message: &Span, result: &'static str) {
    tracing::event!(target: TARGET, parent: message, Level::INFO, store = result, "stored");
}

/// One handler call: its context is what the provider receives.
pub fn handler(message: &Span, attempt: u32, epoch: Epoch) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, parent: message, "dedupq.handler",
        otel.kind = "client", attempt, epoch = epoch.0,
        outcome = Empty, otel.status_code = Empty)
}

/// Records the handler's outcome; anything but an answer (success or a
/// definitive refusal) marks the span an error.
pub fn handled(span: &Span, outcome: &'static str, answered: bool) {
    span.record("outcome", outcome);
    if !answered {
        span.record("otel.status_code", "ERROR");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Source;
    use opentelemetry::trace::{SpanId, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Keeps what it is given, for the test to read.
    #[derive(Debug, Clone, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    const A: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const A2: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
    const B: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-53995c3f42cd8ad8-01";

    fn message(id: u64, traceparent: Option<&str>) -> Incoming {
        let m = Incoming::new(Source::Direct { id }, b"{}".to_vec());
        match traceparent {
            Some(tp) => m.with_header("traceparent", tp),
            None => m,
        }
    }

    /// Held by every test that sets the process-wide flag, so that one
    /// test's setting is the one its spans are made under.
    static FLAG: Mutex<()> = Mutex::new(());

    /// The batch and message spans of one engine call over `batch`: the
    /// batch span first, then the message spans in order.
    fn spans_of(batch: &[Incoming]) -> Vec<SpanData> {
        let mut spans = engine_spans(batch, true);
        spans.retain(|s| s.name == "dedupq.batch" || s.name == "dedupq.message");
        spans
    }

    /// Every finished span of one engine call over `batch` (its batch,
    /// messages, statements and one handler call), with the flag set to
    /// `exporting`, sorted as [`spans_of`] says.
    fn engine_spans(batch: &[Incoming], exporting: bool) -> Vec<SpanData> {
        let _flag = FLAG.lock().unwrap_or_else(|e| e.into_inner());
        set_exporting(exporting);
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        // With one registered dispatcher tracing caches whether a call site
        // is wanted from the default of the thread that reaches it first (a
        // parallel test without a subscriber); a second live one makes it ask
        // every registered dispatcher.
        let _every_dispatcher_asked = tracing::Dispatch::new(tracing_subscriber::registry());
        tracing::subscriber::with_default(subscriber, || {
            tracing::callsite::rebuild_interest_cache();
            let trace = BatchTrace::open(batch);
            drop(claim(batch.len()));
            drop(finish(batch.len()));
            if let Some(first) = trace.messages.first() {
                drop(handler(first, 1, Epoch(1)));
            }
            drop(trace);
        });
        let mut spans = kept.0.lock().unwrap().clone();
        // The batch first, then the messages by their source (`direct:<id>`).
        spans.sort_by_key(|s| {
            let source = s.attributes.iter().find(|kv| kv.key.as_str() == "source");
            (
                s.name != "dedupq.batch",
                source.map(|kv| kv.value.to_string()),
            )
        });
        spans
    }

    fn span_id(traceparent: &str) -> SpanId {
        SpanId::from_hex(&traceparent[36..52]).unwrap()
    }

    #[test]
    fn a_batch_of_one_trace_is_a_child_of_its_first_producer_span() {
        let spans = spans_of(&[message(1, Some(A)), message(2, Some(A2)), message(3, None)]);
        let (batch, messages) = (&spans[0], &spans[1..]);
        assert_eq!(batch.parent_span_id, span_id(A));
        assert_eq!(batch.span_context.trace_id().to_string(), &A[3..35]);
        assert_eq!(messages[0].parent_span_id, span_id(A));
        assert_eq!(messages[1].parent_span_id, span_id(A2));
        let untraced = &messages[2];
        assert_eq!(
            untraced.parent_span_id,
            SpanId::INVALID,
            "not put into a producer's trace"
        );
        assert_ne!(
            untraced.span_context.trace_id(),
            batch.span_context.trace_id()
        );
        for m in messages {
            assert_eq!(m.links.links.len(), 1, "each message links its batch");
            assert_eq!(m.links.links[0].span_context, batch.span_context);
        }
    }

    #[test]
    fn a_batch_of_several_traces_starts_its_own_and_links_every_producer() {
        let spans = spans_of(&[message(1, Some(A)), message(2, Some(B)), message(3, None)]);
        let (batch, messages) = (&spans[0], &spans[1..]);
        assert_eq!(batch.parent_span_id, SpanId::INVALID);
        let linked: Vec<SpanId> = batch
            .links
            .links
            .iter()
            .map(|l| l.span_context.span_id())
            .collect();
        assert_eq!(linked, [span_id(A), span_id(B)]);
        assert_eq!(messages[0].parent_span_id, span_id(A));
        assert_eq!(messages[1].parent_span_id, span_id(B));
        let untraced = &messages[2];
        assert_eq!(
            untraced.parent_span_id,
            batch.span_context.span_id(),
            "in the batch's own trace"
        );
        assert!(untraced.links.links.is_empty());
    }

    #[test]
    fn without_an_exporter_no_span_is_made() {
        let batch = [message(1, Some(A)), message(2, Some(B)), message(3, None)];
        let exported = engine_spans(&batch, true);
        let names: Vec<&str> = exported.iter().map(|s| s.name.as_ref()).collect();
        for name in [
            "dedupq.batch",
            "dedupq.message",
            "dedupq.claim",
            "dedupq.finish",
            "dedupq.handler",
        ] {
            assert!(names.contains(&name), "{name} exported: {names:?}");
        }
        let off = engine_spans(&batch, false);
        assert!(
            off.is_empty(),
            "spans made with no exporter installed: {:?}",
            off.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
    }
}
