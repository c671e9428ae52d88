//! docker-compose.yml cannot run here (no Docker engine), so its wiring is
//! checked by reading it: services, the dedupq config it mounts, the
//! Prometheus scrape target and every metric the Grafana dashboard queries.

use dedupq::config::Settings;
use dedupq::metrics::Metrics;
use std::collections::BTreeSet;
use std::path::Path;

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn compose_runs_the_services_dedupq_the_provider_prometheus_and_grafana() {
    let compose: serde_yaml::Value = serde_yaml::from_str(&repo("docker-compose.yml")).unwrap();
    let services = compose["services"].as_mapping().expect("services");
    for name in [
        "postgres",
        "kafka",
        "rabbitmq",
        "provider",
        "dedupq",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(name), "service {name}");
    }
    let dedupq = &compose["services"]["dedupq"];
    let mounts: Vec<&str> = dedupq["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let config_mount = mounts
        .iter()
        .find(|m| m.contains("dedupq.toml"))
        .expect("dedupq config mounted");
    let host_path = config_mount.split(':').next().unwrap();
    let settings: Settings = toml::from_str(&repo(host_path)).expect("the mounted config parses");
    settings.validate().expect("the mounted config is valid");
    assert!(!settings.kafka.topics.is_empty() && !settings.amqp.queues.is_empty());
    assert_eq!(settings.http.listen.port(), 9464);
    for dep in ["postgres", "kafka", "rabbitmq"] {
        assert_eq!(
            dedupq["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy"),
            "{dep}"
        );
    }

    let prometheus: serde_yaml::Value =
        serde_yaml::from_str(&repo("deploy/prometheus.yml")).unwrap();
    let target = prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0]
        .as_str()
        .unwrap();
    assert_eq!(target, "dedupq:9464");
}

/// Metric names a PromQL expression uses (identifiers starting `dedupq_`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("dedupq_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo("deploy/grafana/dashboards/dedupq.json")).unwrap();
    let mut exported = BTreeSet::new();
    for name in &Metrics::new().names {
        for suffix in ["", "_bucket", "_count", "_sum"] {
            exported.insert(format!("{name}{suffix}"));
        }
    }
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut queried = BTreeSet::new();
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            queried.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    let unknown: Vec<_> = queried.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics dedupq does not export: {unknown:?}"
    );
    for wanted in [
        "dedupq_messages_total",
        "dedupq_lease_takeovers_total",
        "dedupq_fenced_writes_total",
        "dedupq_kafka_consumer_lag",
        "dedupq_handler_duration_seconds_bucket",
        "dedupq_keys",
    ] {
        assert!(queried.contains(wanted), "the dashboard shows {wanted}");
    }
}
