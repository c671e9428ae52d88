//! The standard OpenTelemetry variables configure a real `dedupq run`
//! without a `[telemetry]` section, and its JSON log lines name the trace
//! they were written in.

use super::jaeger::Jaeger;
use super::traces::{charged, kafka_section, produce, traceparent};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use serde_json::Value;
use std::time::Duration;

const SERVICE: &str = "payments-dedupq";

/// The log's JSON lines; a line that is not JSON fails the test.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_otel_variables_configure_export_and_json_log_lines_carry_the_trace_id() {
    let jaeger = Jaeger::start().await;
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let mut config = base_config(&store, &provider);
    assert!(!config.contains_key("telemetry"));
    config["log"]
        .as_table_mut()
        .expect("a [log] section")
        .insert("format".into(), "json".into());
    let topic = kafka_section(&mut config).await;
    let mut dedupq = Dedupq::launch(
        &config,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_grpc.as_str()),
            ("OTEL_SERVICE_NAME", SERVICE),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=overridden,deployment.environment=it%20run",
            ),
        ],
    );
    dedupq
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("dedupq ready");

    produce(&topic, "pay-otel-env", Vec::new()).await;
    let charge = charged(&provider, "pay-otel-env").await;
    let (trace_id, _) = traceparent(&charge);
    let trace = jaeger
        .wait_for(&trace_id, &["dedupq.message", "dedupq.handler"])
        .await;
    let message = trace.one("dedupq.message");
    assert_eq!(
        message.service, SERVICE,
        "OTEL_SERVICE_NAME names the service"
    );
    assert_eq!(
        message.resource.get("deployment.environment"),
        Some(&Value::from("it run")),
        "OTEL_RESOURCE_ATTRIBUTES, percent-decoded: {message:#?}"
    );

    let traced = eventually(
        Duration::from_secs(30),
        "a log line in the trace",
        || async {
            let lines = json_lines(&dedupq.log());
            let traced: Vec<Value> = lines
                .into_iter()
                .filter(|l| l["trace_id"] == trace_id.as_str())
                .collect();
            (!traced.is_empty()).then_some(traced)
        },
    )
    .await;
    let span_ids: Vec<&str> = trace.spans.iter().map(|s| s.span_id.as_str()).collect();
    for line in &traced {
        let span_id = line["span_id"]
            .as_str()
            .expect("a span_id beside the trace_id");
        assert!(
            span_ids.contains(&span_id),
            "the line's span_id is a span of the trace: {line}\n{span_ids:?}"
        );
        assert!(
            line["message"].is_string() && line["level"].is_string(),
            "{line}"
        );
    }
    let first = &json_lines(&dedupq.log())[0];
    assert!(
        first.get("trace_id").is_none() && first.get("span_id").is_none(),
        "a start-up line, outside any span, has no ids: {first}"
    );
}

#[tokio::test]
async fn a_bad_otel_variable_stops_start_up_naming_the_variable() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let config = base_config(&store, &provider);
    for (variable, value) in [
        ("OTEL_RESOURCE_ATTRIBUTES", "team"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
    ] {
        let mut dedupq = Dedupq::launch(&config, &[(variable, value)]);
        let status = dedupq.wait_exit(Duration::from_secs(30)).await;
        let log = dedupq.log();
        assert_eq!(status.code(), Some(2), "{variable}={value}: {log}");
        assert!(
            log.contains(&format!("(env {variable})")),
            "the error names {variable}: {log}"
        );
    }
}
