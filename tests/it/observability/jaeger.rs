//! A Jaeger collector for one test (the binary scripts/observability
//! builds): OTLP gRPC and HTTP receivers, in-memory storage and the query
//! API, each on a port of its own; killed when dropped.

use crate::support::{eventually, process::free_port, unique};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The directory of the CA and server certificate `scripts/services up`
/// generates (the server certificate names 127.0.0.1 and localhost).
pub fn services_tls_dir() -> PathBuf {
    let dir =
        std::env::var("DEDUPQ_SERVICES_DIR").unwrap_or_else(|_| "/var/tmp/dedupq-services".into());
    PathBuf::from(dir).join("tls")
}

pub struct Jaeger {
    child: Child,
    /// OTLP over gRPC, as `telemetry.endpoint` names it.
    pub otlp_grpc: String,
    /// OTLP over HTTP: the base URL.
    pub otlp_http: String,
    query: String,
    client: reqwest::Client,
}

/// One span as Jaeger's query API shows it.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub span_id: String,
    pub service: String,
    /// The attributes of the resource it was exported with.
    pub resource: BTreeMap<String, Value>,
    /// The span it is a child of (a CHILD_OF reference in its trace).
    pub parent: Option<String>,
    /// The spans it links (FOLLOWS_FROM references).
    pub links: Vec<String>,
    pub tags: BTreeMap<String, Value>,
    /// The fields of each of its events.
    pub events: Vec<BTreeMap<String, Value>>,
}

impl Span {
    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// The spans of one trace.
#[derive(Debug, Clone)]
pub struct Trace {
    pub spans: Vec<Span>,
}

impl Trace {
    pub fn named(&self, name: &str) -> Vec<&Span> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The only span called `name`; panics, showing the trace, otherwise.
    pub fn one(&self, name: &str) -> &Span {
        match self.named(name)[..] {
            [span] => span,
            _ => panic!("not exactly one span {name} in {self:#?}"),
        }
    }
}

impl Jaeger {
    pub async fn start() -> Self {
        Self::launch(false).await
    }

    /// Both OTLP receivers over TLS only, with the services' server
    /// certificate (signed by their CA).
    pub async fn start_tls() -> Self {
        Self::launch(true).await
    }

    async fn launch(tls: bool) -> Self {
        let dir = std::env::temp_dir().join(unique("jaeger"));
        std::fs::create_dir_all(&dir).unwrap();
        let [grpc, http, query, query_grpc] = [(); 4].map(|_| free_port());
        let (scheme, tls_block) = if tls {
            let certs = services_tls_dir();
            let block = format!(
                ", tls: {{cert_file: {}, key_file: {}}}",
                certs.join("server.pem").display(),
                certs.join("server.key").display()
            );
            ("https", block)
        } else {
            ("http", String::new())
        };
        let config = format!(
            "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces: {{receivers: [otlp], processors: [batch], exporters: [jaeger_storage_exporter]}}
  telemetry:
    metrics: {{level: none}}
    logs: {{level: warn}}
extensions:
  jaeger_storage:
    backends: {{mem: {{memory: {{max_traces: 10000}}}}}}
  jaeger_query:
    storage: {{traces: mem}}
    http: {{endpoint: 127.0.0.1:{query}}}
    grpc: {{endpoint: 127.0.0.1:{query_grpc}}}
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:{grpc}{tls_block}}}
      http: {{endpoint: 127.0.0.1:{http}{tls_block}}}
processors:
  batch: {{timeout: 100ms}}
exporters:
  jaeger_storage_exporter: {{trace_storage: mem}}
"
        );
        let config_path = dir.join("jaeger.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.join("jaeger.log")).unwrap();
        let child = Command::new("jaeger")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the jaeger binary is on the PATH (run scripts/observability)");
        let me = Self {
            child,
            otlp_grpc: format!("{scheme}://127.0.0.1:{grpc}"),
            otlp_http: format!("{scheme}://127.0.0.1:{http}"),
            query: format!("http://127.0.0.1:{query}"),
            client: reqwest::Client::new(),
        };
        eventually(Duration::from_secs(60), "jaeger serving", || async {
            let services = me.get("/api/services").await?;
            let receiver = tokio::net::TcpStream::connect(("127.0.0.1", grpc)).await;
            receiver.ok().map(|_| services)
        })
        .await;
        me
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let r = self
            .client
            .get(format!("{}{path}", self.query))
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())?;
        r.json().await.ok()
    }

    /// The trace as stored so far, if Jaeger knows it.
    pub async fn trace(&self, trace_id: &str) -> Option<Trace> {
        let body = self.get(&format!("/api/traces/{trace_id}")).await?;
        parse(body["data"].get(0)?)
    }

    /// Waits until the trace holds a span of every name in `names`.
    pub async fn wait_for(&self, trace_id: &str, names: &[&str]) -> Trace {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut last = None;
        loop {
            if let Some(t) = self.trace(trace_id).await {
                if names.iter().all(|n| !t.named(n).is_empty()) {
                    return t;
                }
                last = Some(t);
            }
            if tokio::time::Instant::now() > deadline {
                panic!("trace {trace_id} did not show {names:?} in 60 s; it holds: {last:#?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn parse(trace: &Value) -> Option<Trace> {
    let services: BTreeMap<&str, &str> = trace["processes"]
        .as_object()?
        .iter()
        .filter_map(|(id, p)| Some((id.as_str(), p["serviceName"].as_str()?)))
        .collect();
    let fields = |list: &Value| -> BTreeMap<String, Value> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["key"].as_str()?.to_string(), t["value"].clone())))
            .collect()
    };
    let process = |s: &Value| &trace["processes"][s["processID"].as_str().unwrap_or_default()];
    let spans = trace["spans"]
        .as_array()?
        .iter()
        .map(|s| Span {
            name: s["operationName"].as_str().unwrap_or_default().into(),
            span_id: s["spanID"].as_str().unwrap_or_default().into(),
            service: services
                .get(s["processID"].as_str().unwrap_or_default())
                .unwrap_or(&"")
                .to_string(),
            resource: fields(&process(s)["tags"]),
            parent: references(s, "CHILD_OF").into_iter().next(),
            links: references(s, "FOLLOWS_FROM"),
            tags: fields(&s["tags"]),
            events: s["logs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| fields(&l["fields"]))
                .collect(),
        })
        .collect();
    Some(Trace { spans })
}

fn references(span: &Value, kind: &str) -> Vec<String> {
    span["references"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["refType"] == kind)
        .filter_map(|r| Some(r["spanID"].as_str()?.to_string()))
        .collect()
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
