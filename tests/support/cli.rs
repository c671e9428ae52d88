//! Runs the real `dedupq` binary as an operator would, with a configuration
//! file of its own.

use super::unique;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one command did.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// stdout as JSON lines; panics with the whole output otherwise.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        assert_eq!(
            self.code, 0,
            "command failed:\n{}\n{}",
            self.stdout, self.stderr
        );
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}

/// Writes `config` to a file of its own.
pub fn config_file(config: &toml::Table) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("dedupq-cli"));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let path = dir.join("dedupq.toml");
    std::fs::write(&path, toml::to_string(config).expect("serialize config"))
        .expect("write config");
    path
}

/// Longest any command may take before the test calls it hung: past every
/// timeout of the commands themselves.
const HUNG_AFTER: Duration = Duration::from_secs(120);

/// `dedupq --config <config> <args…>` with `env` set.
pub fn run(config: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Ran {
    run_within(config, args, env, HUNG_AFTER)
}

/// `run`, killing the command once it has run for `limit`: a hung command
/// fails its test (exit code -1, "killed" in stderr) instead of hanging it.
pub fn run_within(config: &PathBuf, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Ran {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dedupq"));
    command.arg("--config").arg(config).args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    run_command(command, limit)
}

/// Runs `command`, killing it once it has run for `limit`: the whole
/// process group, so that a wrapper's child (faketime's dedupq) goes too
/// and lets go of the pipes.
fn run_command(mut command: Command, limit: Duration) -> Ran {
    use std::os::unix::process::CommandExt;
    let mut child = command
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dedupq (under faketime, which scripts/services up installs, when skewed)");
    // Read both pipes while waiting, so a full pipe never blocks the child.
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for dedupq") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().expect("stdout reader");
    let mut stderr = stderr.join().expect("stderr reader");
    if status.is_none() {
        stderr.push_str(&format!("\n[killed: still running after {limit:?}]"));
    }
    Ran {
        code: status.and_then(|s| s.code()).unwrap_or(-1),
        stdout,
        stderr,
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `dedupq --config <config> <args…>` on a host whose clock is `offset`
/// from the real one (libfaketime, e.g. "+30s"). Only the wall clock is
/// faked: tokio's timers run on the monotonic clock, left alone.
pub fn run_skewed(config: &PathBuf, offset: &str, args: &[&str]) -> Ran {
    let mut command = Command::new("faketime");
    command
        .args(["-f", offset, env!("CARGO_BIN_EXE_dedupq"), "--config"])
        .arg(config)
        .args(args)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    run_command(command, HUNG_AFTER)
}

/// `dedupq migrate [extra]` on `schema` as the role of `url`, configured by
/// the environment only; stdout + stderr, as Err on failure.
pub fn migrate(url: &str, schema: &str, extra: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .arg("migrate")
        .args(extra)
        .env("DEDUPQ__STORE__URL", url)
        .env("DEDUPQ__STORE__SCHEMA", schema)
        .output()
        .expect("run dedupq migrate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}
