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

#[test]
fn compose_pins_its_images_checks_health_and_outlasts_the_drain() {
    let compose: serde_yaml::Value = serde_yaml::from_str(&repo("docker-compose.yml")).unwrap();
    let services = compose["services"].as_mapping().expect("services");
    for (name, service) in services {
        let image = service["image"]
            .as_str()
            .expect("every service names its image");
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        assert!(
            tag.chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == 'v')
                && tag != "latest",
            "{name:?}: image {image} is not pinned to a version"
        );
    }
    let dedupq = &compose["services"]["dedupq"];
    let settings: Settings = toml::from_str(&repo("deploy/dedupq.toml")).unwrap();
    let grace = humantime::parse_duration(dedupq["stop_grace_period"].as_str().unwrap()).unwrap();
    assert!(
        grace >= settings.kafka.drain_timeout + std::time::Duration::from_secs(15),
        "stop_grace_period {grace:?} must outlast kafka.drain_timeout"
    );
    assert!(dedupq["healthcheck"]["test"].as_sequence().is_some());
    let probe = format!("{:?}", dedupq["healthcheck"]["test"]);
    assert!(probe.contains("/readyz") && probe.contains(&settings.http.listen.port().to_string()));
    for (dep, condition) in dedupq["depends_on"].as_mapping().unwrap() {
        let condition = condition["condition"].as_str().unwrap();
        let dep = dep.as_str().unwrap();
        // One-shot services (the migrations, the topics) finish first.
        let expected = if dep == "migrate" || dep == "topics" {
            "service_completed_successfully"
        } else {
            "service_healthy"
        };
        assert_eq!(condition, expected, "{dep}");
        if expected == "service_healthy" {
            assert!(
                compose["services"][dep]["healthcheck"].is_mapping(),
                "{dep} has a healthcheck"
            );
        }
    }
    let image = format!("dedupq:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(dedupq["image"].as_str(), Some(image.as_str()));
}

#[test]
fn compose_hands_dedupq_and_the_migrate_job_the_secret_files_their_configuration_reads() {
    let compose: serde_yaml::Value = serde_yaml::from_str(&repo("docker-compose.yml")).unwrap();
    let settings: Settings = toml::from_str(&repo("deploy/dedupq.toml")).unwrap();
    assert_eq!(settings.store.migrate, dedupq::config::MigrateMode::Check);
    let mounted = |service: &str| -> Vec<String> {
        compose["services"][service]["secrets"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|s| format!("/run/secrets/{}", s.as_str().unwrap()))
            .collect()
    };
    let files = [&settings.store.url_file, &settings.amqp.url_file];
    for file in files {
        let file = file
            .as_ref()
            .expect("URLs with passwords come from secret files");
        assert!(
            mounted("dedupq").contains(&file.display().to_string()),
            "{file:?}"
        );
    }
    let migrate = &compose["services"]["migrate"];
    assert_eq!(migrate["command"][0].as_str(), Some("migrate"));
    let url_file = migrate["environment"]["DEDUPQ__STORE__URL_FILE"]
        .as_str()
        .unwrap();
    assert_eq!(
        Some(std::path::PathBuf::from(url_file)),
        settings.store.url_file
    );
    assert!(mounted("migrate").contains(&url_file.to_string()));
    for secret in compose["secrets"].as_mapping().unwrap().values() {
        let file = secret["file"].as_str().unwrap();
        let url = repo(file);
        assert!(
            url.starts_with("postgres://") || url.starts_with("amqp://"),
            "{file}"
        );
    }
}

#[test]
fn the_image_holds_every_program_compose_runs_and_builds_with_every_workspace_member() {
    let compose: serde_yaml::Value = serde_yaml::from_str(&repo("docker-compose.yml")).unwrap();
    let dockerfile = repo("Dockerfile");
    let image = format!("dedupq:{}", env!("CARGO_PKG_VERSION"));
    let final_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let installed = |program: &str| {
        final_stage
            .lines()
            .filter(|l| l.starts_with("COPY --from=builder"))
            .any(|l| l.contains(&format!("/usr/local/bin/{program} ")))
    };
    let entrypoint = final_stage
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("the image has an entrypoint");
    for (name, service) in compose["services"].as_mapping().unwrap() {
        if service["image"].as_str() != Some(image.as_str()) {
            continue;
        }
        let program = match service["entrypoint"][0].as_str() {
            Some(program) => program.to_string(),
            None => serde_json::from_str::<Vec<String>>(entrypoint).unwrap()[0].clone(),
        };
        assert!(
            installed(&program),
            "{name:?} runs {program}, not in the image"
        );
    }
    let manifest: toml::Table = repo("Cargo.toml").parse().unwrap();
    for member in manifest["workspace"]["members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        if member != "." {
            assert!(
                dockerfile.contains(&format!("COPY {member}/Cargo.toml")),
                "the dependency layer needs {member}/Cargo.toml"
            );
        }
    }
}
