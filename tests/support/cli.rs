//! Runs the real `dedupq` binary as an operator would, with a configuration
//! file of its own.

use super::unique;
use std::path::PathBuf;
use std::process::Command;

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

/// `dedupq --config <config> <args…>` with `env` set.
pub fn run(config: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dedupq"));
    command.arg("--config").arg(config).args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    ran(command.output().expect("run dedupq"))
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
    ran(command
        .output()
        .expect("run dedupq under faketime (scripts/services up installs it)"))
}

fn ran(out: std::process::Output) -> Ran {
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
