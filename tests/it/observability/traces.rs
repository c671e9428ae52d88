//! Traces end to end, through a real Jaeger: a producer's span exported by
//! the test, its `traceparent` on a Kafka record, in an AMQP header or on
//! an HTTP API request, a real `dedupq run` exporting to the same Jaeger,
//! and the provider
//! simulator recording the trace context each charge request carried. One
//! trace must run from the producer's span through dedupq's batch, message
//! and handler spans to the provider's request, whose parent is dedupq's
//! handler span (not the producer's: a `broken` build run with
//! `DEDUPQ_BROKEN=no-trace-propagation` forwards the producer's header
//! instead, and these tests fail on it).

use super::jaeger::{services_tls_dir, Jaeger, Trace};
use crate::support::amqp::{self, Client};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, kafka, unique};
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use dedupq_provider::{Charge, Knobs};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{Span as _, SpanContext, SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::Context;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::collections::HashMap;
use std::time::Duration;

const SERVICE: &str = "dedupq-under-test";
const PRODUCER: &str = "payments-producer";
const TRACESTATE: &str = "producer=7f3a";
const BODY: &str = r#"{"amount": 1250, "currency": "EUR", "recipient": "shop-9"}"#;

/// The span a payment service makes when it sends the command, exported
/// to Jaeger as that service would.
struct ProducerSpan {
    context: SpanContext,
}

impl ProducerSpan {
    async fn export(jaeger: &Jaeger) -> Self {
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&jaeger.otlp_grpc)
            .build()
            .expect("an OTLP exporter");
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(PRODUCER).build())
            .build();
        let tracer = provider.tracer("dedupq-tests");
        let mut span = tracer
            .span_builder("payment.send")
            .with_kind(SpanKind::Producer)
            .start(&tracer);
        let context = span.span_context().clone();
        span.end();
        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .unwrap()
            .expect("the producer's span was exported");
        Self { context }
    }

    /// `traceparent` as the producer's propagator writes it, and a
    /// `tracestate` entry of its vendor.
    fn headers(&self) -> Vec<(String, String)> {
        let mut carrier: HashMap<String, String> = HashMap::new();
        let cx = Context::new().with_remote_span_context(self.context.clone());
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.insert("tracestate".into(), TRACESTATE.into());
        carrier.into_iter().collect()
    }

    fn trace_id(&self) -> String {
        self.context.trace_id().to_string()
    }

    fn span_id(&self) -> String {
        self.context.span_id().to_string()
    }
}

/// A `dedupq run` configuration exporting to `jaeger` over `protocol`.
async fn config(jaeger: &Jaeger, protocol: &str, provider: &Provider) -> toml::Table {
    let (_, store) = isolated_store().await;
    let mut config = base_config(&store, provider);
    let endpoint = match protocol {
        "grpc" => &jaeger.otlp_grpc,
        _ => &jaeger.otlp_http,
    };
    let section = format!(
        "enabled = true\nendpoint = \"{endpoint}\"\nprotocol = \"{protocol}\"\n\
         service_name = \"{SERVICE}\"\nexport_timeout = \"5s\""
    );
    config.insert(
        "telemetry".into(),
        toml::Value::Table(section.parse().unwrap()),
    );
    config
}

pub(super) async fn kafka_section(config: &mut toml::Table) -> String {
    let (topic, _dlq) = kafka::topics("trace", 1).await;
    let section = format!(
        "topics = [\"{topic}\"]\nbrokers = \"{}\"\ngroup_id = \"{}\"\n\
         commit_interval = \"200ms\"\nsession_timeout = \"6s\"",
        kafka::brokers(),
        unique("trace")
    );
    config.insert("kafka".into(), toml::Value::Table(section.parse().unwrap()));
    topic
}

pub(super) async fn produce(topic: &str, key: &str, extra: Vec<(String, String)>) {
    let mut headers = kafka::headers("acme", key);
    headers.extend(extra.into_iter().map(|(k, v)| (k, v.into_bytes())));
    kafka::produce(&kafka::producer(), topic, 0, &headers, BODY.as_bytes()).await;
}

/// Publishes into `queue` with `extra` as AMQP header-table text entries,
/// and waits for the broker's confirm.
async fn publish(queue: &str, key: &str, extra: Vec<(String, String)>) {
    let msg = amqp::Msg::new("acme", key, BODY).headers(extra);
    amqp::Client::connect().await.publish(queue, &msg).await;
}

/// The charge the provider made for `key` (of tenant acme).
pub(super) async fn charged(provider: &Provider, key: &str) -> Charge {
    let derived = format!("acme:{key}");
    eventually(Duration::from_secs(60), "the provider charged", || async {
        provider.charges_for(&derived).await.into_iter().next()
    })
    .await
}

/// `00-<trace id>-<parent span id>-<flags>` split into trace and parent.
pub(super) fn traceparent(charge: &Charge) -> (String, String) {
    let header = charge
        .traceparent
        .as_deref()
        .expect("the provider's request carried a traceparent");
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "a version-00 traceparent: {header}");
    assert_eq!(parts[3], "01", "sampled: {header}");
    (parts[1].to_string(), parts[2].to_string())
}

/// dedupq's spans in `trace` for a message of `transport` whose producer
/// span is `producer`, and the provider request they led to.
fn assert_continued(
    trace: &Trace,
    producer: &ProducerSpan,
    charge: &Charge,
    transport: &str,
    key: &str,
) {
    let sent = trace.one("payment.send");
    assert_eq!(sent.service, PRODUCER);

    let message = trace.one("dedupq.message");
    assert_eq!(message.service, SERVICE);
    assert_eq!(
        message.parent.as_deref(),
        Some(producer.span_id().as_str()),
        "the message span continues the producer's span"
    );
    for (tag, value) in [
        ("tenant", "acme"),
        ("key", key),
        ("epoch", "1"),
        ("outcome", "processed"),
        ("transport", transport),
        ("span.kind", "consumer"),
    ] {
        assert_eq!(
            message.tag(tag).as_deref(),
            Some(value),
            "message span tag {tag}: {message:#?}"
        );
    }
    let event = |field: &str, value: &str| {
        message
            .events
            .iter()
            .any(|e| e.get(field).and_then(|v| v.as_str()) == Some(value))
    };
    assert!(
        event("claim", "won"),
        "the claim is an event of the message span: {message:#?}"
    );
    assert!(
        event("store", "landed"),
        "the stored outcome is an event of the message span: {message:#?}"
    );

    let batch = trace.one("dedupq.batch");
    assert_eq!(
        batch.parent.as_deref(),
        Some(producer.span_id().as_str()),
        "a batch of one trace is in that trace"
    );
    assert_eq!(batch.tag("size").as_deref(), Some("1"));
    assert_eq!(batch.tag("transport").as_deref(), Some(transport));
    assert_eq!(
        message.links,
        std::slice::from_ref(&batch.span_id),
        "the message span links its batch"
    );
    for statement in ["dedupq.claim", "dedupq.finish"] {
        let s = trace.one(statement);
        assert_eq!(
            s.parent.as_deref(),
            Some(batch.span_id.as_str()),
            "{statement} inside the batch"
        );
    }

    let handler = trace.one("dedupq.handler");
    assert_eq!(handler.parent.as_deref(), Some(message.span_id.as_str()));
    assert_eq!(handler.tag("outcome").as_deref(), Some("success"));

    let (trace_id, parent) = traceparent(charge);
    assert_eq!(
        trace_id,
        producer.trace_id(),
        "the provider request is in the producer's trace"
    );
    assert_eq!(
        parent, handler.span_id,
        "the provider request is a child of dedupq's handler span, not of the producer's"
    );
    assert_eq!(
        charge.tracestate.as_deref(),
        Some(TRACESTATE),
        "the producer's tracestate goes on"
    );
}

const SPANS: [&str; 6] = [
    "payment.send",
    "dedupq.batch",
    "dedupq.claim",
    "dedupq.message",
    "dedupq.handler",
    "dedupq.finish",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kafka_payment_is_one_trace_from_the_producer_span_to_the_provider_request() {
    let jaeger = Jaeger::start().await;
    let producer = ProducerSpan::export(&jaeger).await;
    let provider = Provider::start(Knobs::default()).await;
    let mut config = config(&jaeger, "grpc", &provider).await;
    let topic = kafka_section(&mut config).await;
    let _dedupq = Dedupq::start(&config).await;

    produce(&topic, "pay-traced", producer.headers()).await;
    let charge = charged(&provider, "pay-traced").await;

    let trace = jaeger.wait_for(&producer.trace_id(), &SPANS).await;
    assert_continued(&trace, &producer, &charge, "kafka", "pay-traced");
}

/// Over AMQP and OTLP/HTTP; with a batch delay far longer than the test,
/// dedupq's spans reach Jaeger only because stopping the process flushes
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_amqp_payment_continues_its_trace_and_dedupq_flushes_its_spans_when_stopped() {
    let jaeger = Jaeger::start().await;
    let producer = ProducerSpan::export(&jaeger).await;
    let provider = Provider::start(Knobs::default()).await;
    let mut config = config(&jaeger, "http", &provider).await;
    let settings: AmqpSettings = amqp::settings(QueueType::Quorum);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let mut dedupq = Dedupq::launch(&config, &[("OTEL_BSP_SCHEDULE_DELAY", "600000")]);
    dedupq
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("dedupq ready");

    publish(&settings.queues[0], "pay-amqp", producer.headers()).await;
    let charge = charged(&provider, "pay-amqp").await;
    let before = jaeger.trace(&producer.trace_id()).await;
    assert!(
        before.iter().all(|t| t.named("dedupq.message").is_empty()),
        "nothing exported before the stop (the batch delay is 10 minutes): {before:#?}"
    );
    let pid = dedupq.pid().expect("running").to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(term.expect("kill runs").success());
    let status = dedupq.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "a clean stop: {status}\n{}",
        dedupq.log_tail()
    );

    let trace = jaeger.wait_for(&producer.trace_id(), &SPANS).await;
    assert_continued(&trace, &producer, &charge, "amqp", "pay-amqp");
    Client::connect().await.cleanup(&settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_without_a_traceparent_starts_a_trace_of_its_own() {
    let jaeger = Jaeger::start().await;
    let provider = Provider::start(Knobs::default()).await;
    let mut config = config(&jaeger, "grpc", &provider).await;
    let topic = kafka_section(&mut config).await;
    let _dedupq = Dedupq::start(&config).await;

    produce(&topic, "pay-untraced", Vec::new()).await;
    let charge = charged(&provider, "pay-untraced").await;
    let (trace_id, parent) = traceparent(&charge);
    assert_ne!(trace_id, "0".repeat(32));
    assert_eq!(
        charge.tracestate, None,
        "no tracestate was given, none is made up"
    );

    let trace = jaeger
        .wait_for(
            &trace_id,
            &["dedupq.batch", "dedupq.message", "dedupq.handler"],
        )
        .await;
    assert!(
        trace.spans.iter().all(|s| s.service == SERVICE),
        "dedupq's spans only: {trace:#?}"
    );
    let batch = trace.one("dedupq.batch");
    assert_eq!(batch.parent, None, "the batch starts the trace");
    let message = trace.one("dedupq.message");
    assert_eq!(message.parent.as_deref(), Some(batch.span_id.as_str()));
    assert!(message.links.is_empty(), "its parent is its batch: no link");
    assert_eq!(message.tag("key").as_deref(), Some("pay-untraced"));
    let handler = trace.one("dedupq.handler");
    assert_eq!(handler.parent.as_deref(), Some(message.span_id.as_str()));
    assert_eq!(
        parent, handler.span_id,
        "the provider request is a child of the handler span"
    );
}

/// The HTTP API is the third way in: the caller's `traceparent` and
/// `tracestate` headers are continued like a broker message's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http_api_request_continues_the_callers_trace() {
    let jaeger = Jaeger::start().await;
    let caller = ProducerSpan::export(&jaeger).await;
    let provider = Provider::start(Knobs::default()).await;
    let mut config = config(&jaeger, "grpc", &provider).await;
    let dir = std::env::temp_dir().join(unique("trace-api"));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("api-keys.toml");
    std::fs::write(&keys, "\"sk_test_trace_0123456789\" = \"acme\"\n").unwrap();
    let listen = format!("127.0.0.1:{}", crate::support::process::free_port());
    let section = format!(
        "enabled = true\nlisten = \"{listen}\"\nkeys_file = \"{}\"\nroutes = [{{ name = \"payments\" }}]",
        keys.display()
    );
    config.insert("api".into(), toml::Value::Table(section.parse().unwrap()));
    let _dedupq = Dedupq::start(&config).await;

    // Sent again until the listener is up: the key makes that safe.
    let answer = eventually(Duration::from_secs(30), "the API answers", || async {
        let mut request = reqwest::Client::new()
            .post(format!("http://{listen}/v1/payments"))
            .bearer_auth("sk_test_trace_0123456789")
            .header("idempotency-key", "pay-http")
            .header("content-type", "application/json")
            .body(BODY);
        for (name, value) in caller.headers() {
            request = request.header(name, value);
        }
        request.send().await.ok()
    })
    .await;
    assert_eq!(answer.status(), 201, "charged");
    let charge = charged(&provider, "pay-http").await;

    let trace = jaeger.wait_for(&caller.trace_id(), &SPANS).await;
    assert_continued(&trace, &caller, &charge, "http", "pay-http");
}

/// An untraced Kafka payment through a `dedupq run` that exports to
/// `jaeger` over `protocol`, trusting `ca`; the process is stopped (which
/// flushes its spans) before the trace is looked up. Returns the trace,
/// if the collector holds one.
async fn exported_over_tls(jaeger: &Jaeger, protocol: &str, ca: &str) -> Option<Trace> {
    let provider = Provider::start(Knobs::default()).await;
    let mut config = config(jaeger, protocol, &provider).await;
    let ca = services_tls_dir().join(ca);
    let telemetry = config["telemetry"].as_table_mut().unwrap();
    telemetry.insert("ca_file".into(), ca.display().to_string().into());
    let topic = kafka_section(&mut config).await;
    let mut dedupq = Dedupq::start(&config).await;

    let key = format!("pay-tls-{protocol}");
    produce(&topic, &key, Vec::new()).await;
    let (trace_id, _) = traceparent(&charged(&provider, &key).await);
    let stopped = dedupq.terminate(Duration::from_secs(30)).await;
    assert!(
        stopped.is_some(),
        "a clean stop
{}",
        dedupq.log_tail()
    );
    // Jaeger stores what it received within its 100 ms batch timeout.
    let names = ["dedupq.batch", "dedupq.message", "dedupq.handler"];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let trace = jaeger.trace(&trace_id).await;
        let whole = trace
            .as_ref()
            .is_some_and(|t| names.iter().all(|n| !t.named(n).is_empty()));
        if whole || tokio::time::Instant::now() > deadline {
            return trace;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A collector that serves OTLP over TLS only, with a certificate of a
/// private CA: `telemetry.ca_file` makes it trusted, over gRPC and HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_a_tls_collector_verified_against_the_configured_ca() {
    let jaeger = Jaeger::start_tls().await;
    assert!(jaeger.otlp_grpc.starts_with("https://"));
    for protocol in ["grpc", "http"] {
        let trace = exported_over_tls(&jaeger, protocol, "ca.pem").await;
        let trace = trace.unwrap_or_else(|| panic!("{protocol}: no trace reached the collector"));
        for name in ["dedupq.batch", "dedupq.message", "dedupq.handler"] {
            assert_eq!(trace.named(name).len(), 1, "{protocol}: {trace:#?}");
        }
    }
}

/// The same collector, with `telemetry.ca_file` naming a CA that did not
/// sign its certificate (and the public roots do not know it either): the
/// certificate is refused and no span leaves dedupq, over gRPC or HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_collector_certificate_the_configured_ca_did_not_sign_gets_no_spans() {
    let jaeger = Jaeger::start_tls().await;
    for protocol in ["grpc", "http"] {
        let trace = exported_over_tls(&jaeger, protocol, "other-ca.pem").await;
        assert!(
            trace.is_none(),
            "{protocol}: spans crossed an unverified TLS connection: {trace:#?}"
        );
    }
}

/// The log of a `dedupq run` with `telemetry` as its `[telemetry]`
/// section, which must refuse to start (exit code 2).
async fn refused_at_start(config: &mut toml::Table, telemetry: &str) -> String {
    config.insert(
        "telemetry".into(),
        toml::Value::Table(telemetry.parse().unwrap()),
    );
    let mut dedupq = Dedupq::launch(config, &[]);
    let status = dedupq.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "{}", dedupq.log());
    dedupq.log()
}

#[tokio::test]
async fn a_collector_url_that_cannot_be_used_stops_start_up_naming_the_setting() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let mut config = base_config(&store, &provider);
    let log = refused_at_start(&mut config, "enabled = true\nendpoint = \"collector:4317\"").await;
    assert!(
        log.contains("invalid setting `telemetry.endpoint`") && log.contains("//host:4317"),
        "the error names the setting and the fix: {log}"
    );

    // A CA file that cannot be read stops start-up naming its setting.
    let section = "enabled = true\nca_file = \"/nonexistent/collector-ca.pem\"";
    let log = refused_at_start(&mut config, section).await;
    assert!(
        log.contains("invalid setting `telemetry.ca_file`")
            && log.contains("/nonexistent/collector-ca.pem"),
        "the error names the setting and the file: {log}"
    );
}
