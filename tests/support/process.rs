//! Real processes for crash tests: the `dedupq` binary (killed with
//! SIGKILL), and the provider simulator that counts effects.

use super::unique;
use dedupq::config::StoreSettings;
use dedupq_provider::{Charge, Knobs, Stats};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// The `dedupq` binary without the `DEDUPQ__…` variables this test
/// process inherited (scripts/test exports `DEDUPQ__STORE__URL`): only its
/// configuration file and what the test sets configure it.
pub fn dedupq_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dedupq"));
    for (name, _) in std::env::vars().filter(|(k, _)| k.starts_with("DEDUPQ__")) {
        command.env_remove(name);
    }
    command
}

/// Runs `command` with the open-files limits `soft` and `hard`.
pub fn limit_open_files(command: &mut Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls only setrlimit,
    // which is async-signal-safe, on a struct of its own.
    unsafe {
        command.pre_exec(move || {
            let l = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Configuration sections every process test needs: the isolated store,
/// short leases, the payment handler aimed at `provider`.
pub fn base_config(store: &StoreSettings, provider: &Provider) -> toml::Table {
    let text = format!(
        r#"
[store]
url = "{url}"
schema = "{schema}"
max_connections = 8

[engine]
lease = "3s"
renew_every = "1s"
retry_backoff_min = "50ms"
retry_backoff_max = "500ms"

[handler]
kind = "payment"
url = "{charges}"
timeout = "2s"
retry_for = "1h"

[retention]
redelivery_horizon = "1h"

[log]
filter = "info,dedupq=debug"
"#,
        url = store.url.expose(),
        schema = store.schema.as_deref().unwrap_or("public"),
        charges = provider.charges_url(),
    );
    text.parse().expect("base config is valid TOML")
}

/// One `dedupq run` process.
pub struct Dedupq {
    child: Option<Child>,
    config: PathBuf,
    log: PathBuf,
    /// What the configuration file holds, without its `[http]` section.
    table: toml::Table,
    pub http: SocketAddr,
    /// Environment of the process (e.g. `DEDUPQ__…` secrets). Inherited
    /// `DEDUPQ__…` variables (scripts/test exports `DEDUPQ__STORE__URL`)
    /// are always dropped, so the configuration file and this list are all
    /// the process sees.
    env: Vec<(String, String)>,
    /// The process's open-files limits (soft, hard), if not inherited.
    open_files: Option<(u64, u64)>,
}

impl Dedupq {
    /// Writes `config` (plus an `[http]` section of its own) to a file,
    /// starts `dedupq run --config <file>` and waits for /healthz.
    pub async fn start(config: &toml::Table) -> Self {
        let mut me = Self::configure(config);
        me.spawn().await;
        me
    }

    /// Like `start`, without waiting for anything (for processes expected
    /// to exit, or watched from the first moment), configured by `config`
    /// and `env` only: inherited `DEDUPQ__…` variables are dropped.
    pub fn launch(config: &toml::Table, env: &[(&str, &str)]) -> Self {
        let mut me = Self::configure(config);
        me.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        me.spawn_child();
        me
    }

    /// Like `start`, with the open-files limits `soft` and `hard`
    /// (`RLIMIT_NOFILE`) instead of the test's.
    pub async fn start_with_open_files(config: &toml::Table, soft: u64, hard: u64) -> Self {
        let mut me = Self::configure(config);
        me.open_files = Some((soft, hard));
        me.spawn().await;
        me
    }

    /// Like `run_to_exit`, with the open-files limits `soft` and `hard`.
    pub async fn run_to_exit_with_open_files(
        config: &toml::Table,
        soft: u64,
        hard: u64,
        limit: Duration,
    ) -> (Option<i32>, String) {
        let mut me = Self::configure(config);
        me.open_files = Some((soft, hard));
        me.spawn_child();
        me.exit_within(limit).await
    }

    /// Runs `dedupq run` with `config` and waits up to `limit` for it to
    /// exit by itself (a start-up refusal); returns its exit code (None:
    /// still running at the limit, then killed) and its output.
    pub async fn run_to_exit(config: &toml::Table, limit: Duration) -> (Option<i32>, String) {
        Self::launch(config, &[]).exit_within(limit).await
    }

    async fn exit_within(mut self, limit: Duration) -> (Option<i32>, String) {
        let me = &mut self;
        let deadline = tokio::time::Instant::now() + limit;
        let code = loop {
            if let Some(status) = me.exit_status() {
                break Some(status.code().unwrap_or(-1));
            }
            if tokio::time::Instant::now() > deadline {
                me.kill();
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        me.child = None;
        (code, me.log())
    }

    /// Waits until /readyz answers 200; Err with the log if the process
    /// exits first or the limit passes.
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let url = format!("http://{}/readyz", self.http);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(r) = reqwest::get(&url).await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if let Some(status) = self.exit_status() {
                return Err(format!("exited with {status}:\n{}", self.log_tail()));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("not ready in {limit:?}:\n{}", self.log_tail()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit by itself; panics after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("dedupq still running after {limit:?}:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The exit status, once the process has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn configure(config: &toml::Table) -> Self {
        let dir = std::env::temp_dir().join(unique("dedupq"));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let me = Self {
            child: None,
            config: dir.join("dedupq.toml"),
            log: dir.join("dedupq.log"),
            table: config.clone(),
            http: SocketAddr::from(([127, 0, 0, 1], free_port())),
            env: Vec::new(),
            open_files: None,
        };
        me.write_config();
        me
    }

    /// Writes the configuration file: the test's table, with an `[http]`
    /// section listening on `self.http`.
    fn write_config(&self) {
        let mut config = self.table.clone();
        let mut section = toml::Table::new();
        section.insert("listen".into(), toml::Value::String(self.http.to_string()));
        config.insert("http".into(), toml::Value::Table(section));
        std::fs::write(
            &self.config,
            toml::to_string(&config).expect("serialize config"),
        )
        .expect("write config");
    }

    fn spawn_child(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let mut command = dedupq_command();
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some((soft, hard)) = self.open_files {
            limit_open_files(&mut command, soft, hard);
        }
        let child = command
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn dedupq");
        self.child = Some(child);
    }

    /// Starts the process and waits for its /healthz. The port was free
    /// when it was chosen, but another test may have bound it since (the
    /// process then ends, naming `http.listen`): then it starts again on
    /// another port.
    async fn spawn(&mut self) {
        for _ in 0..5 {
            let from = self.log().len();
            self.spawn_child();
            if self.healthy().await {
                return;
            }
            let status = self.exit_status().expect("exited during start-up");
            let log = self.log();
            if !log[from..].contains("binding http.listen") {
                panic!(
                    "dedupq exited with {status} during start-up:\n{}",
                    self.log_tail()
                );
            }
            self.child = None;
            self.http.set_port(free_port());
            self.write_config();
        }
        panic!("no free port for http.listen after five tries");
    }

    /// Waits until /healthz answers as dedupq does (200, `ok`) and /metrics
    /// holds dedupq's series: true; false once the process has exited.
    /// Whoever else holds the port answers otherwise.
    async fn healthy(&mut self) -> bool {
        let url = format!("http://{}/healthz", self.http);
        let metrics = format!("http://{}/metrics", self.http);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("http client");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if self.exit_status().is_some() {
                return false;
            }
            if answers(&client, &url, |b| b == "ok\n").await
                && answers(&client, &metrics, |b| b.contains("# TYPE dedupq_")).await
            {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "dedupq did not answer /healthz in 30 s:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` (as `kill` spells it: `-STOP`, `-HUP`) to the process.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("running").to_string();
        let sent = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {sig} {pid}");
    }

    /// SIGKILL, and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process is still running (false once it exited, or was
    /// killed by the test).
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGTERM, then waits up to `limit` for the process to exit; returns
    /// how long it took (None: still running at the limit, then SIGKILLed).
    pub async fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        let started = tokio::time::Instant::now();
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {}", child.id());
        while started.elapsed() < limit {
            if child.try_wait().ok().flatten().is_some() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// `/readyz`: whether it answered 200, and its body.
    pub async fn readyz(&self) -> (bool, String) {
        let r = reqwest::get(format!("http://{}/readyz", self.http))
            .await
            .expect("GET /readyz");
        let ok = r.status().is_success();
        (ok, r.text().await.expect("readyz body"))
    }

    /// Starts the same configuration again (same log; same port unless
    /// another listener took it meanwhile).
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.http))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body")
    }

    /// The value of one series, e.g. `dedupq_messages_total{outcome="processed",transport="kafka"}`.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

/// Whether `url` answers 200 with a body `body` accepts.
async fn answers(client: &reqwest::Client, url: &str, body: impl Fn(&str) -> bool) -> bool {
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => r.text().await.is_ok_and(|b| body(&b)),
        _ => false,
    }
}

impl Drop for Dedupq {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sums the samples of `series` (a metric name, optionally with some of its
/// labels) in a Prometheus text exposition; 0 when absent.
pub fn metric_value(exposition: &str, series: &str) -> f64 {
    let (name, wanted) = match series.split_once('{') {
        Some((n, rest)) => (
            n,
            rest.trim_end_matches('}')
                .split(',')
                .filter(|s| !s.is_empty())
                .collect(),
        ),
        None => (series, Vec::new()),
    };
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(s, _)| {
            let (n, labels) = s.split_once('{').unwrap_or((s, ""));
            n == name && wanted.iter().all(|w| labels.contains(w))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// The provider simulator, served from the test process on its own port
/// and schema.
pub struct Provider {
    pub base: String,
    /// The schema of its ledger.
    pub schema: String,
    shutdown: CancellationToken,
    client: reqwest::Client,
}

impl Provider {
    pub async fn start(knobs: Knobs) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind provider");
        let base = format!(
            "http://{}",
            listener.local_addr().expect("provider address")
        );
        let shutdown = CancellationToken::new();
        let schema = unique("prov");
        let stop = shutdown.clone();
        let serving = schema.clone();
        tokio::spawn(async move {
            dedupq_provider::serve(listener, &super::database_url(), &serving, knobs, stop)
                .await
                .expect("provider serves");
        });
        let provider = Self {
            base,
            schema,
            shutdown,
            client: reqwest::Client::new(),
        };
        super::eventually(Duration::from_secs(10), "provider ready", || async {
            provider
                .client
                .get(format!("{}/stats", provider.base))
                .send()
                .await
                .ok()?
                .error_for_status()
                .ok()
        })
        .await;
        provider
    }

    pub fn charges_url(&self) -> String {
        format!("{}/charges", self.base)
    }

    pub async fn set_knobs(&self, patch: Value) {
        self.client
            .post(format!("{}/admin/knobs", self.base))
            .json(&patch)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .expect("set knobs");
    }

    pub async fn stats(&self) -> Stats {
        self.client
            .get(format!("{}/stats", self.base))
            .send()
            .await
            .expect("GET /stats")
            .json()
            .await
            .expect("stats JSON")
    }

    /// `n` payments were charged, each once: `n` charges under `n` keys.
    pub async fn charged_once_each(&self, n: usize) {
        let stats = self.stats().await;
        assert_eq!(
            stats.charges, n as i64,
            "every payment charged exactly once"
        );
        assert_eq!(stats.keys, n as i64, "one key per payment");
        assert_eq!(stats.double_charged, 0, "no key charged twice");
    }

    /// Charges made with this idempotency key (the derived key `tenant:key`).
    pub async fn charges_for(&self, derived_key: &str) -> Vec<Charge> {
        let v: Value = self
            .client
            .get(format!("{}/charges", self.base))
            .query(&[("key", derived_key)])
            .send()
            .await
            .expect("GET /charges")
            .json()
            .await
            .expect("charges JSON");
        serde_json::from_value(v["charges"].clone()).expect("charge list")
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
