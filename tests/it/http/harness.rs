//! The whole service in-process (`Application`, as `dedupq run` builds it)
//! with the HTTP API on a port of its own, an isolated schema and the
//! provider simulator; and a client that speaks to it like an app would.

use crate::support::process::{free_port, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq::config::{RouteSettings, Settings};
use dedupq::metrics::Metrics;
use dedupq::startup::Application;
use dedupq::store::Store;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ACME_KEY: &str = "sk_test_acme_0123456789";
pub const GLOBEX_KEY: &str = "sk_test_globex_0123456789";

/// A scratch directory for the keys and secret files of one test.
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("dedupq-api"));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// The API keys file: acme and globex.
pub fn keys_file(dir: &Path) -> PathBuf {
    let path = dir.join("api-keys.toml");
    let text = format!("\"{ACME_KEY}\" = \"acme\"\n\"{GLOBEX_KEY}\" = \"globex\"\n");
    std::fs::write(&path, text).expect("write keys file");
    path
}

pub fn secret_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{secret}\n")).expect("write secret file");
    path
}

/// A sync route with the default key header.
pub fn sync_route(name: &str) -> RouteSettings {
    toml::from_str(&format!("name = \"{name}\"")).expect("route")
}

/// Settings of one test: its schema, short leases, the payment handler
/// aimed at `provider`, and the API with the keys file and `/v1/payments`.
pub fn settings(
    store: &dedupq::config::StoreSettings,
    provider: &Provider,
    dir: &Path,
) -> Settings {
    let mut s = Settings {
        store: store.clone(),
        ..Settings::default()
    };
    s.engine.lease = Duration::from_secs(3);
    s.engine.renew_every = Duration::from_secs(1);
    s.engine.retry_backoff_min = Duration::from_millis(50);
    s.engine.retry_backoff_max = Duration::from_millis(500);
    s.handler.url = provider.charges_url();
    s.handler.timeout = Duration::from_secs(2);
    s.retention.redelivery_horizon = Duration::from_secs(3600);
    s.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    s.api.enabled = true;
    s.api.listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    s.api.keys_file = Some(keys_file(dir));
    s.api.routes = vec![sync_route("payments")];
    s
}

/// The service running in this test's process.
pub struct App {
    pub base: String,
    /// The operator endpoint (/readyz, /metrics).
    pub ops: SocketAddr,
    pub store: Store,
    pub metrics: Metrics,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl App {
    /// Starts with `settings` as given by `settings(..)` and then changed.
    /// The API's port was free when `settings(..)` chose it, but another
    /// test may have bound it since (the application binds it once it
    /// runs, and a refused bind ends it): then it starts again on
    /// another port.
    pub async fn start(mut settings: Settings) -> Self {
        settings.validate().expect("valid test settings");
        for _ in 0..5 {
            match Self::try_start(settings.clone()).await {
                Ok(app) => return app,
                Err(e) if format!("{e:#}").contains("binding api.listen") => {
                    settings.api.listen.set_port(free_port());
                }
                Err(e) => panic!("the application stopped while starting: {e:#}"),
            }
        }
        panic!("no free port for the API after five tries");
    }

    async fn try_start(settings: Settings) -> anyhow::Result<Self> {
        let api = settings.api.listen;
        let app = Application::build(settings)
            .await
            .expect("application builds");
        let shutdown = app.shutdown_token();
        let ops = app.local_addr();
        let store = app.store().clone();
        let metrics = app.metrics().clone();
        let task = tokio::spawn(app.run_until_stopped());
        // Listening, and answering as dedupq does (a problem document for a
        // path it does not serve), or ended: whoever else holds the port
        // answers otherwise.
        let probe = format!("http://{api}/harness-probe");
        let ours = eventually(Duration::from_secs(30), "the API listens", || async {
            if task.is_finished() {
                return Some(false);
            }
            let r = reqwest::get(&probe).await.ok()?;
            let problem = r
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
            problem.then_some(true)
        })
        .await;
        if !ours {
            shutdown.cancel();
            task.await.expect("no panic")?;
            anyhow::bail!("the application ended before its API answered");
        }
        Ok(Self {
            base: format!("http://{api}"),
            ops,
            store,
            metrics,
            shutdown,
            task: Some(task),
        })
    }

    /// A fresh schema, the provider and the default settings, changed by `edit`.
    pub async fn with(provider: &Provider, edit: impl FnOnce(&mut Settings, &Path)) -> Self {
        let (_, store) = isolated_store().await;
        let dir = scratch();
        let mut s = settings(&store, provider, &dir);
        edit(&mut s, &dir);
        Self::start(s).await
    }

    /// Waits until /readyz reports the store and every configured broker up.
    pub async fn wait_ready(&self) {
        let url = format!("http://{}/readyz", self.ops);
        eventually(Duration::from_secs(30), "the service is ready", || async {
            let r = reqwest::get(&url).await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
    }

    pub fn url(&self, route: &str) -> String {
        format!("{}/v1/{route}", self.base)
    }

    /// `POST /v1/payments` as acme with this key and body.
    pub async fn pay(&self, key: &str, body: &str) -> Reply {
        self.post("payments", Some(ACME_KEY), Some(key), body).await
    }

    /// `pay`, sent again as a client does while it is answered 409 (the
    /// key still being decided, also in the moment between its outcome's
    /// commit and the end of its decision), after the `Retry-After` each
    /// 409 gives; at most 20 times.
    pub async fn pay_honouring_409(&self, key: &str, body: &str) -> Reply {
        let mut tries = 1;
        loop {
            let r = self.pay(key, body).await;
            if r.status != 409 || tries == 20 {
                return r;
            }
            tokio::time::sleep(Duration::from_secs(r.retry_after())).await;
            tries += 1;
        }
    }

    pub async fn post(
        &self,
        route: &str,
        api_key: Option<&str>,
        key: Option<&str>,
        body: &str,
    ) -> Reply {
        let send = || {
            let mut request = client().post(self.url(route)).body(body.to_string());
            request = request.header("content-type", "application/json");
            if let Some(k) = api_key {
                request = request.bearer_auth(k);
            }
            if let Some(k) = key {
                request = request.header("Idempotency-Key", k);
            }
            request.send()
        };
        let sent = match send().await {
            // A connection that closed before any answer (on a machine
            // too busy to read the request in time): the client does what
            // the README tells clients to do, and sends the same key again.
            Err(e) if key.is_some() && e.is_request() && !e.is_timeout() => {
                eprintln!("no answer ({e:?}); sending the same key again");
                send().await
            }
            sent => sent,
        };
        Reply::from(sent.expect("the API answers")).await
    }

    /// Deliveries of this outcome on this transport, counted by the engine.
    pub fn decided(&self, transport: &str, outcome: &str) -> u64 {
        self.metrics
            .messages
            .with_label_values(&[transport, outcome])
            .get()
    }

    /// The key row's status, if the key was claimed.
    pub async fn status(&self, tenant: &str, key: &str) -> Option<String> {
        sqlx::query_scalar("SELECT status FROM dedupq_keys WHERE tenant = $1 AND key = $2")
            .bind(tenant)
            .bind(key)
            .fetch_optional(self.store.pool())
            .await
            .expect("read key status")
    }

    /// Graceful stop; returns how long it took.
    pub async fn stop(mut self) -> Duration {
        let started = tokio::time::Instant::now();
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("the application stops")
                .expect("no panic")
                .expect("the application stops cleanly");
        }
        started.elapsed()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client")
}

/// Waits until something accepts connections on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    eventually(Duration::from_secs(30), "the API listens", || async {
        tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
    })
    .await;
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    pub async fn from(r: reqwest::Response) -> Self {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.expect("answer body");
        Self {
            status,
            headers,
            text,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// A problem+json answer with this status; returns its type.
    pub fn problem(&self, status: u16) -> String {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let p = self.json();
        assert_eq!(p["status"], status, "{p}");
        assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
        p["type"].as_str().expect("a problem type").to_string()
    }

    /// Seconds in Retry-After (panics if absent).
    pub fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no Retry-After: {self:?}"))
    }
}
