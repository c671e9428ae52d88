//! The Prometheus server for one test: its own port, data directory and
//! configuration, killed when dropped.

use crate::support::{eventually, process::free_port, unique};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Prometheus {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Prometheus {
    /// Scrapes `targets` every second as job `dedupq` and evaluates the
    /// repository's alert rules every second.
    pub async fn start(targets: &[SocketAddr]) -> Self {
        let dir = std::env::temp_dir().join(unique("prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: dedupq\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the prometheus server is installed (run scripts/observability)");
        let me = Self {
            child,
            base: format!("http://{listen}"),
            client: reqwest::Client::new(),
        };
        eventually(Duration::from_secs(30), "prometheus ready", || async {
            let r = me
                .client
                .get(format!("{}/-/ready", me.base))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        me
    }

    /// An instant query: Ok(the result vector) or Err(Prometheus' error).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let body: Value = self
            .client
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The alerting rules as Prometheus loaded and last evaluated them.
    pub async fn rules(&self) -> Vec<Value> {
        let body: Value = self
            .client
            .get(format!("{}/api/v1/rules", self.base))
            .send()
            .await
            .expect("GET /api/v1/rules")
            .json()
            .await
            .expect("rules JSON");
        body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
