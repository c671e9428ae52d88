//! The alert rules, their runbook sections in docs/runbook.md and their panels
//! on the dashboard belong together; the dashboard does not over-count
//! table-wide gauges across replicas. Their labels and runbook_url follow
//! kube-prometheus's conventions (tests/it/observability/alert_conventions.rs).

use std::path::Path;

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn alerts() -> Vec<serde_yaml::Value> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&repo("deploy/prometheus/alerts.yml")).unwrap();
    rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().clone())
        .collect()
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&repo("deploy/grafana/dashboards/dedupq.json")).unwrap()
}

#[test]
fn every_alert_has_a_runbook_section_that_says_what_to_check_and_which_command_fixes_it() {
    let runbook = repo("docs/runbook.md");
    let all = alerts();
    assert!(all.len() >= 10, "the alerts the operators asked for");
    for rule in all {
        let name = rule["alert"].as_str().unwrap();
        let heading = format!("\n## {name}\n");
        let start = runbook
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/runbook.md has no section {name}"));
        let section = &runbook[start + heading.len()..];
        let section = &section[..section.find("\n#").unwrap_or(section.len())];
        for part in ["**Means**", "**Check**", "**Fix**"] {
            assert!(section.contains(part), "{name}: no {part}");
        }
        let fix = &section[section.find("**Fix**").unwrap()..];
        assert!(
            fix.contains("`dedupq "),
            "{name}: the fix names a dedupq command"
        );
    }
}

#[test]
fn the_dashboard_has_a_panel_per_alert_and_variables_for_datasource_job_and_instance() {
    let d = dashboard();
    let titles: Vec<&str> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for rule in alerts() {
        let want = format!("Alert: {}", rule["alert"].as_str().unwrap());
        assert!(titles.contains(&want.as_str()), "no panel {want}");
    }
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance"]);
    for p in d["panels"].as_array().unwrap() {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("job=~\"$job\""), "{}: {expr}", p["title"]);
        }
    }
}

#[test]
fn table_wide_gauges_take_the_max_over_replicas_and_latency_panels_show_p50_and_p99() {
    let d = dashboard();
    for p in d["panels"].as_array().unwrap() {
        let exprs: Vec<&str> = p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["expr"].as_str().unwrap())
            .collect();
        for e in &exprs {
            if e.contains("dedupq_keys{") {
                assert!(
                    e.starts_with("max"),
                    "{}: every replica exports the whole table: {e}",
                    p["title"]
                );
                assert!(
                    !e.contains("$instance"),
                    "{}: table-wide, not per instance",
                    p["title"]
                );
            }
        }
        let title = p["title"].as_str().unwrap();
        if title.contains("p50 / p99") {
            assert!(
                exprs
                    .iter()
                    .any(|e| e.starts_with("histogram_quantile(0.5,")),
                "{title}"
            );
            assert!(
                exprs
                    .iter()
                    .any(|e| e.starts_with("histogram_quantile(0.99,")),
                "{title}"
            );
        }
    }
}
