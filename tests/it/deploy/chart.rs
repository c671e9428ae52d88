//! The Helm chart (deploy/helm/dedupq) carries the same configuration and
//! wiring as deploy/kubernetes/: its values' TOML is the ConfigMap's, so the
//! chart's pods start as the manifests' do, and its Secrets, ports and
//! probes are the ones the configuration reads and dedupq serves. scripts/helm
//! lints and renders the chart and validates what it renders.

use dedupq::config::{MigrateMode, Settings};
use serde_yaml::Value;
use std::path::Path;

fn yaml_documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

fn values() -> Value {
    yaml_documents("deploy/helm/dedupq/values.yaml").remove(0)
}

fn template(name: &str) -> String {
    let path = format!("deploy/helm/dedupq/templates/{name}");
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_chart_configuration_is_the_configmaps_and_starts() {
    let values = values();
    let configmap = yaml_documents("deploy/kubernetes/configmap.yaml").remove(0);
    for (value, key) in [("config", "dedupq.toml"), ("migrateConfig", "migrate.toml")] {
        assert_eq!(
            values[value], configmap["data"][key],
            "values.yaml `{value}` must be deploy/kubernetes/configmap.yaml's {key}"
        );
    }
    let mut service: Settings = toml::from_str(values["config"].as_str().unwrap()).unwrap();
    // The mounted CA is not on this machine; the rest is checked as is.
    service.amqp.tls_ca_file = None;
    service
        .validate()
        .expect("the chart's configuration is valid");
    assert_eq!(
        service.store.migrate,
        MigrateMode::Check,
        "the runtime role never migrates"
    );
    assert_eq!(
        values["metricsPort"].as_u64(),
        Some(u64::from(service.http.listen.port()))
    );
    let migrate: Settings = toml::from_str(values["migrateConfig"].as_str().unwrap()).unwrap();
    assert_eq!(migrate.store.schema, service.store.schema);
}

#[test]
fn the_chart_mounts_the_example_secrets_and_migrates_in_a_pre_install_and_pre_upgrade_hook() {
    let values = values();
    let names: Vec<String> = yaml_documents("deploy/kubernetes/secrets.example.yaml")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for (role, secret) in [
        ("runtime", "dedupq-runtime"),
        ("owner", "dedupq-owner"),
        ("tls", "dedupq-tls"),
    ] {
        assert_eq!(
            values["secrets"][role]["existingSecret"].as_str(),
            Some(secret)
        );
        assert!(names.contains(&secret.to_string()), "{secret}");
    }
    let job = template("migrate-job.yaml");
    assert!(job.contains("helm.sh/hook: pre-install,pre-upgrade"));
    assert!(job.contains(r#"args: ["migrate", "--config", "/etc/dedupq/config/migrate.toml"]"#));
    assert!(job.contains(".Values.secrets.owner.existingSecret"));
    assert!(
        !job.contains(".Values.secrets.runtime"),
        "the Job has the owner's role only"
    );
    let deployment = template("deployment.yaml");
    assert!(deployment.contains(".Values.secrets.runtime.existingSecret"));
    assert!(
        !deployment.contains(".Values.secrets.owner"),
        "pods never get the owner's role"
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let at = deployment.find(probe).unwrap_or_else(|| panic!("{probe}"));
        assert!(deployment[at..]
            .trim_start_matches(|c| c != '/')
            .starts_with(path));
    }
}
