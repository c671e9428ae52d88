//! The alert rules follow kube-prometheus's conventions: a `severity` of
//! `critical` or `warning`, and a `runbook_url` to the alert's own section
//! of docs/runbook.md in the project's repository (Cargo.toml's
//! `repository`). The PrometheusRule of deploy/kubernetes/ and the Helm
//! chart's copy hold exactly the rules of deploy/prometheus/alerts.yml, and
//! the ServiceMonitor scrapes the metrics Service as job `dedupq`, the job
//! the alerts and deploy/prometheus.yml name.

use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::Path;

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn rules(groups: &Value) -> Vec<Value> {
    groups
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().clone())
        .collect()
}

#[test]
fn every_alert_has_a_severity_and_a_runbook_url_to_the_section_named_after_it() {
    let base = format!(
        "{}/blob/main/docs/runbook.md#",
        env!("CARGO_PKG_REPOSITORY")
    );
    assert_eq!(
        base,
        "https://github.com/dedupq/dedupq/blob/main/docs/runbook.md#"
    );
    let all = rules(&yaml("deploy/prometheus/alerts.yml")["groups"]);
    assert!(all.len() >= 13, "{} rules", all.len());
    for rule in &all {
        let name = rule["alert"].as_str().expect("alerting rules only");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        assert_eq!(
            rule["annotations"]["runbook_url"].as_str(),
            Some(format!("{base}{}", name.to_lowercase()).as_str()),
            "{name}"
        );
        let keys: BTreeSet<&str> = rule["annotations"]
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert!(
            keys.is_subset(&BTreeSet::from(["summary", "description", "runbook_url"])),
            "{name}: annotations {keys:?}"
        );
    }
}

#[test]
fn the_unit_tests_fire_every_alert_and_match_its_severity_and_runbook_url() {
    let tests = yaml("tests/it/observability/alerts_test.yml");
    let mut fired = BTreeSet::new();
    for test in tests["tests"].as_sequence().unwrap() {
        for case in test["alert_rule_test"].as_sequence().unwrap() {
            for alert in case["exp_alerts"].as_sequence().unwrap() {
                let name = case["alertname"].as_str().unwrap();
                assert!(
                    alert["exp_labels"]["severity"].is_string(),
                    "{name}: a firing alert's test names its severity"
                );
                assert!(
                    alert["exp_annotations"]["runbook_url"].is_string(),
                    "{name}: a firing alert's test names its runbook_url"
                );
                fired.insert(name.to_string());
            }
        }
    }
    let all: BTreeSet<String> = rules(&yaml("deploy/prometheus/alerts.yml")["groups"])
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fired, all, "every alert is shown firing");
}

#[test]
fn the_prometheusrule_and_the_chart_hold_the_rules_of_alerts_yml() {
    let source = yaml("deploy/prometheus/alerts.yml")["groups"].clone();
    let rule = yaml("deploy/kubernetes/prometheusrule.yaml");
    assert_eq!(rule["kind"], "PrometheusRule");
    for (copy, groups) in [
        (
            "deploy/kubernetes/prometheusrule.yaml",
            rule["spec"]["groups"].clone(),
        ),
        (
            "deploy/helm/dedupq/files/alerts.yml",
            yaml("deploy/helm/dedupq/files/alerts.yml")["groups"].clone(),
        ),
    ] {
        assert!(
            groups == source,
            "{copy} differs from deploy/prometheus/alerts.yml: run scripts/sync-alerts"
        );
    }
}

#[test]
fn the_servicemonitor_scrapes_the_metrics_port_as_the_job_the_alerts_select() {
    let monitor = yaml("deploy/kubernetes/servicemonitor.yaml");
    let service = yaml("deploy/kubernetes/service.yaml");
    let labels = service["metadata"]["labels"].as_mapping().unwrap();
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(labels.get(k), Some(v), "the Service has label {k:?}");
    }
    let port = &monitor["spec"]["endpoints"][0];
    assert_eq!(port["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(port["path"], "/metrics");

    let job = &labels[monitor["spec"]["jobLabel"].as_str().unwrap()];
    let compose = yaml("deploy/prometheus.yml");
    assert_eq!(job, &compose["scrape_configs"][0]["job_name"]);
    assert_eq!(
        job, "dedupq",
        "the job DedupqDown's up{{job=~\"dedupq.*\"}} matches"
    );
}
