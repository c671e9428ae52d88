//! deploy/kubernetes/ cannot be applied here (no cluster), so its wiring
//! is checked by reading it: the configuration it mounts is valid, ports
//! and probe paths match what dedupq serves, the grace period outlasts the
//! drain, every file the configuration reads is mounted from the right
//! Secret, the Job migrates with the owner's role.

use dedupq::config::{MigrateMode, Settings};
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const DIR: &str = "deploy/kubernetes";

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every document of a manifest file.
fn documents(file: &str) -> Vec<Value> {
    let text = repo(&format!("{DIR}/{file}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .collect()
}

fn manifest(file: &str) -> Value {
    let mut docs = documents(file);
    assert_eq!(docs.len(), 1, "{file}: one object");
    docs.remove(0)
}

fn config(key: &str) -> Settings {
    let map = manifest("configmap.yaml");
    let text = map["data"][key].as_str().unwrap_or_else(|| panic!("{key}"));
    toml::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}"))
}

fn pod_spec(file: &str) -> Value {
    manifest(file)["spec"]["template"]["spec"].clone()
}

/// File path -> (Secret or ConfigMap name, key) for the container's mounts.
fn mounted_files(pod: &Value) -> BTreeMap<PathBuf, (String, String)> {
    let mut volumes = BTreeMap::new();
    for v in pod["volumes"].as_sequence().unwrap() {
        let (source, name) = if v["secret"].is_mapping() {
            (&v["secret"], v["secret"]["secretName"].as_str())
        } else {
            (&v["configMap"], v["configMap"]["name"].as_str())
        };
        let items: Vec<(String, String)> = source["items"]
            .as_sequence()
            .expect("volumes list their items")
            .iter()
            .map(|i| {
                (
                    i["key"].as_str().unwrap().into(),
                    i["path"].as_str().unwrap().into(),
                )
            })
            .collect();
        volumes.insert(
            v["name"].as_str().unwrap().to_string(),
            (name.unwrap().to_string(), items),
        );
    }
    let mut files = BTreeMap::new();
    for m in pod["containers"][0]["volumeMounts"].as_sequence().unwrap() {
        let (object, items) = &volumes[m["name"].as_str().unwrap()];
        for (key, path) in items {
            let file = Path::new(m["mountPath"].as_str().unwrap()).join(path);
            files.insert(file, (object.clone(), key.clone()));
        }
    }
    files
}

/// Every file a configuration reads.
fn files_read(s: &Settings) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        &s.store.url_file,
        &s.amqp.url_file,
        &s.amqp.tls_ca_file,
        &s.handler.url_file,
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    files.extend(s.kafka.client_files.values().cloned());
    files.extend(s.kafka.client.get("ssl.ca.location").map(PathBuf::from));
    files
}

/// Keys of the example Secrets, by Secret name.
fn example_secrets() -> BTreeMap<String, Vec<String>> {
    documents("secrets.example.yaml")
        .iter()
        .map(|d| {
            let keys = d["stringData"].as_mapping().unwrap().keys();
            (
                d["metadata"]["name"].as_str().unwrap().to_string(),
                keys.map(|k| k.as_str().unwrap().to_string()).collect(),
            )
        })
        .collect()
}

#[test]
fn every_manifest_parses_and_the_kustomization_lists_all_but_the_example_secrets() {
    let kustomization = manifest("kustomization.yaml");
    let listed: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(DIR);
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        for doc in documents(&file) {
            assert!(
                doc["kind"].is_string() && doc["apiVersion"].is_string(),
                "{file}"
            );
        }
        // The Prometheus operator's objects need its CRDs: applied on their own.
        let expected = !matches!(
            file.as_str(),
            "kustomization.yaml"
                | "secrets.example.yaml"
                | "prometheusrule.yaml"
                | "servicemonitor.yaml"
        );
        assert_eq!(listed.contains(&file.as_str()), expected, "{file}");
    }
}

#[test]
fn the_deployment_serves_its_probes_on_the_configured_port_and_outlasts_the_drain() {
    let mut settings = config("dedupq.toml");
    // The mounted CA is not on this machine; the rest is checked as is.
    settings.amqp.tls_ca_file = None;
    settings
        .validate()
        .expect("the mounted configuration is valid");
    assert_eq!(
        settings.store.migrate,
        MigrateMode::Check,
        "the runtime role never migrates"
    );

    let pod = pod_spec("deployment.yaml");
    let container = &pod["containers"][0];
    let port = &container["ports"][0];
    assert_eq!(
        port["containerPort"].as_u64(),
        Some(u64::from(settings.http.listen.port()))
    );
    assert!(
        settings.http.listen.ip().is_unspecified(),
        "reachable by the kubelet"
    );
    let name = port["name"].as_str().unwrap();
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some(path));
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some(name));
    }
    let service = manifest("service.yaml");
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_str(),
        Some(name)
    );

    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace >= settings.kafka.drain_timeout.as_secs() + 15,
        "{grace} s must outlast kafka.drain_timeout with room for the final commits"
    );
    for limit in ["requests", "limits"] {
        assert!(
            container["resources"][limit]["memory"].is_string(),
            "{limit}"
        );
    }
    let config_arg = container["args"].as_sequence().unwrap().last().unwrap();
    assert!(mounted_files(&pod).contains_key(Path::new(config_arg.as_str().unwrap())));
}

#[test]
fn every_file_the_configuration_reads_is_mounted_from_the_runtime_secret() {
    let settings = config("dedupq.toml");
    let mounted = mounted_files(&pod_spec("deployment.yaml"));
    let secrets = example_secrets();
    let files = files_read(&settings);
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let (object, key) = mounted
            .get(&file)
            .unwrap_or_else(|| panic!("{} is read but not mounted", file.display()));
        assert!(
            object == "dedupq-runtime" || object == "dedupq-tls",
            "{} comes from {object}",
            file.display()
        );
        assert!(secrets[object].contains(key), "{object} has no key {key}");
    }
}

#[test]
fn the_migrate_job_uses_the_owner_role_on_the_same_schema() {
    let service = config("dedupq.toml");
    let job = config("migrate.toml");
    assert_eq!(job.store.schema, service.store.schema);
    let pod = pod_spec("migrate-job.yaml");
    assert_eq!(pod["containers"][0]["args"][0].as_str(), Some("migrate"));
    let mounted = mounted_files(&pod);
    let url_file = job
        .store
        .url_file
        .clone()
        .expect("the owner URL comes from a file");
    assert_eq!(mounted[&url_file].0, "dedupq-owner");
    assert_eq!(
        files_read(&job),
        vec![url_file],
        "the Job reads no broker secret"
    );
    let deployment = mounted_files(&pod_spec("deployment.yaml"));
    let runtime = service.store.url_file.unwrap();
    assert_eq!(deployment[&runtime].0, "dedupq-runtime");
}

#[test]
fn the_pods_run_the_built_image_as_the_dockerfile_user_and_selectors_match() {
    let dockerfile = repo("Dockerfile");
    let user = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Dockerfile sets a user");
    let uid: u64 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric UID");
    let image = format!("dedupq:{}", env!("CARGO_PKG_VERSION"));
    for file in ["deployment.yaml", "migrate-job.yaml"] {
        let pod = pod_spec(file);
        assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
        assert_eq!(
            pod["securityContext"]["runAsUser"].as_u64(),
            Some(uid),
            "{file}"
        );
        assert_eq!(
            pod["containers"][0]["image"].as_str(),
            Some(image.as_str()),
            "{file}"
        );
    }
    let labels = manifest("deployment.yaml")["spec"]["template"]["metadata"]["labels"].clone();
    assert_eq!(
        manifest("deployment.yaml")["spec"]["selector"]["matchLabels"],
        labels
    );
    assert_eq!(
        manifest("pdb.yaml")["spec"]["selector"]["matchLabels"],
        labels
    );
    assert_eq!(manifest("service.yaml")["spec"]["selector"], labels);
}
