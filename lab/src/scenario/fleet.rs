//! The processes of a scenario: dedupq instances (killed with SIGKILL and
//! restarted) and the provider simulator.

use anyhow::{anyhow, Context};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn spawn(exe: &Path, args: &[&str], envs: &[(&str, &str)], log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", exe.display()))
}

async fn wait_http(
    url: &str,
    what: &str,
    child: &mut Child,
    log: &Path,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(r) = reqwest::get(url).await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if let Some(status) = child.try_wait()? {
            return Err(anyhow!(
                "{what} exited with {status}; log: {}",
                log.display()
            ));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(anyhow!(
                "{what} not ready after {limit:?}; log: {}",
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) struct Instance {
    child: Option<Child>,
    config: PathBuf,
    /// `store.url` of the config, also given as `DEDUPQ__STORE__URL`: the
    /// environment overrides the file, and the scenario's own environment
    /// names the administrator's URL, not the one the fleet is given.
    store_url: Option<String>,
    log: PathBuf,
    pub http: SocketAddr,
}

/// A SIGKILL the scenario dealt: which process.
#[derive(Debug, Clone)]
pub(super) struct Kill {
    pub pid: u32,
}

/// The executables a fleet runs: `dedupq run` processes and the provider
/// simulator.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The `dedupq` binary (the build under test).
    pub dedupq: PathBuf,
    /// The `dedupq-provider` binary.
    pub provider: PathBuf,
}

impl Binaries {
    /// The given paths, or each binary beside the running executable:
    /// cargo builds every binary of the workspace into one directory (a
    /// test executable sits one level below it, in `deps/`).
    pub fn locate(dedupq: Option<PathBuf>, provider: Option<PathBuf>) -> anyhow::Result<Self> {
        Ok(Self {
            dedupq: dedupq.map_or_else(|| beside_this_executable("dedupq"), Ok)?,
            provider: provider.map_or_else(|| beside_this_executable("dedupq-provider"), Ok)?,
        })
    }
}

fn beside_this_executable(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let dir = exe
        .parent()
        .context("the running executable has no directory")?;
    let mut candidates = vec![dir.join(name)];
    if dir.ends_with("deps") {
        candidates.extend(dir.parent().map(|up| up.join(name)));
    }
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| anyhow!("no {name} beside {}: build it (cargo build --bin {name}) or name it with --{name}-bin", exe.display()))
}

pub(super) struct Fleet {
    binaries: Binaries,
    dir: PathBuf,
    pub instances: Vec<Instance>,
    pub kills: Vec<Kill>,
    provider: Option<Child>,
}

impl Fleet {
    pub(super) fn new(dir: &Path, binaries: &Binaries) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            binaries: binaries.clone(),
            dir: dir.to_path_buf(),
            instances: Vec::new(),
            kills: Vec::new(),
            provider: None,
        })
    }

    /// Starts the provider simulator; returns its base URL.
    pub(super) async fn start_provider(
        &mut self,
        database_url: &str,
        schema: &str,
        ignore_keys: bool,
    ) -> anyhow::Result<String> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["--listen", &listen, "--schema", schema];
        if ignore_keys {
            args.push("--ignore-keys");
        }
        let log = self.dir.join("provider.log");
        let mut child = spawn(
            &self.binaries.provider,
            &args,
            &[("DATABASE_URL", database_url)],
            &log,
        )?;
        let base = format!("http://{listen}");
        wait_http(
            &format!("{base}/healthz"),
            "provider",
            &mut child,
            &log,
            Duration::from_secs(30),
        )
        .await?;
        self.provider = Some(child);
        Ok(base)
    }

    /// Starts one `dedupq run` with `config` (an `[http]` section is added)
    /// and waits until it is ready.
    pub(super) async fn start_dedupq(&mut self, mut config: toml::Table) -> anyhow::Result<usize> {
        let i = self.instances.len();
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut section = toml::Table::new();
        section.insert("listen".into(), toml::Value::String(http.to_string()));
        config.insert("http".into(), toml::Value::Table(section));
        let path = self.dir.join(format!("dedupq-{i}.toml"));
        std::fs::write(&path, toml::to_string(&config)?)?;
        let store_url = config
            .get("store")
            .and_then(|s| s.get("url"))
            .and_then(toml::Value::as_str)
            .map(str::to_string);
        self.instances.push(Instance {
            child: None,
            config: path,
            store_url,
            log: self.dir.join(format!("dedupq-{i}.log")),
            http,
        });
        self.spawn_instance(i).await?;
        Ok(i)
    }

    async fn spawn_instance(&mut self, i: usize) -> anyhow::Result<()> {
        let inst = &mut self.instances[i];
        let config = inst.config.to_string_lossy().to_string();
        let envs: Vec<(&str, &str)> = inst
            .store_url
            .iter()
            .map(|url| ("DEDUPQ__STORE__URL", url.as_str()))
            .collect();
        let mut child = spawn(
            &self.binaries.dedupq,
            &["run", "--config", &config],
            &envs,
            &inst.log,
        )?;
        let url = format!("http://{}/readyz", inst.http);
        wait_http(
            &url,
            "dedupq",
            &mut child,
            &inst.log,
            Duration::from_secs(60),
        )
        .await?;
        inst.child = Some(child);
        Ok(())
    }

    /// SIGKILL instance `i` (no chance to finish anything).
    pub(super) fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.instances[i].child.take() {
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            self.kills.push(Kill { pid });
        }
    }

    /// The pid of instance `i`, while it runs.
    pub(super) fn pid(&self, i: usize) -> Option<u32> {
        self.instances[i].child.as_ref().map(Child::id)
    }

    /// SIGSTOP instance `i` (frozen: no lease renewal, no I/O, as a long
    /// GC pause or a stalled VM looks) or SIGCONT it.
    pub(super) fn freeze(&self, i: usize, frozen: bool) -> anyhow::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| anyhow!("instance {i} is not running"))?;
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    pub(super) async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        self.spawn_instance(i).await
    }

    /// SIGTERM every dedupq instance and wait for it (SIGKILL after
    /// `grace`). The provider keeps running for the checks.
    pub(super) async fn stop_instances(&mut self, grace: Duration) {
        let children: Vec<Child> = self
            .instances
            .iter_mut()
            .filter_map(|i| i.child.take())
            .collect();
        for c in &children {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
        let deadline = tokio::time::Instant::now() + grace;
        for mut c in children {
            while c.try_wait().ok().flatten().is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for inst in &mut self.instances {
            if let Some(mut c) = inst.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(mut c) = self.provider.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
