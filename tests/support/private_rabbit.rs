//! A RabbitMQ node of one test's own, beside the shared one: for faults
//! that are node-wide (a memory alarm blocks every publishing connection),
//! which the shared node would spread to every test running at once. Same
//! package as the shared node (`scripts/services` installs it), its own
//! name, ports and data directory; stopped when dropped.

use super::pooler::running_as_root;
use super::unique;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct PrivateRabbit {
    node: String,
    dir: PathBuf,
    pub port: u16,
}

impl PrivateRabbit {
    /// Starts the node and waits until it takes connections.
    pub async fn start() -> Self {
        let dir = std::env::temp_dir().join(unique("rabbit"));
        std::fs::create_dir_all(&dir).expect("create the node's directory");
        let port = super::process::free_port();
        let dist = super::process::free_port();
        let node = format!("{}@localhost", unique("dqt"));
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.default = 127.0.0.1:{port}\n"),
        )
        .expect("write rabbitmq.conf");
        // No plugins: the shared node's management listener keeps its port.
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
        let env = format!(
            "RABBITMQ_NODENAME={node} RABBITMQ_DIST_PORT={dist} \
             RABBITMQ_CONFIG_FILE={d}/rabbitmq.conf \
             RABBITMQ_ENABLED_PLUGINS_FILE={d}/enabled_plugins \
             RABBITMQ_MNESIA_BASE={d}/mnesia RABBITMQ_LOG_BASE={d}/log \
             RABBITMQ_PID_FILE={d}/pid",
            d = dir.display()
        );
        let start = format!("env {env} rabbitmq-server -detached");
        let status = if running_as_root() {
            // The node runs as the package's user, with its Erlang cookie,
            // so rabbitmqctl reaches it as it reaches the shared node.
            chown_to_rabbitmq(&dir);
            Command::new("su")
                .args(["rabbitmq", "-s", "/bin/sh", "-c", &start])
                .status()
        } else {
            Command::new("sh").args(["-c", &start]).status()
        };
        assert!(
            status.expect("start rabbitmq-server").success(),
            "rabbitmq-server did not start"
        );
        let me = Self { node, dir, port };
        let pid = me.dir.join("pid");
        let pid = pid.to_str().expect("a UTF-8 path");
        me.ctl(&["wait", pid, "--timeout", "120"]);
        me
    }

    /// `amqp://` URL of the node.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Raises a memory alarm (`on`), which blocks every connection that
    /// publishes, or clears it; returns once the node reports it so.
    pub async fn memory_alarm(&self, on: bool) {
        let watermark = if on { "0.000001" } else { "0.4" };
        self.ctl(&["set_vm_memory_high_watermark", watermark]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.alarmed() != on {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the node did not report its alarm {} within 60 s",
                if on { "raised" } else { "cleared" }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the node reports a resource alarm.
    fn alarmed(&self) -> bool {
        let out = Command::new("rabbitmq-diagnostics")
            .args(["-q", "-n", &self.node, "check_local_alarms"])
            .output()
            .expect("run rabbitmq-diagnostics");
        !out.status.success()
    }

    /// Runs `rabbitmqctl` against this node; panics if it fails.
    fn ctl(&self, args: &[&str]) {
        let out = Command::new("rabbitmqctl")
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .output()
            .expect("run rabbitmqctl");
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} on {}: {}{}",
            self.node,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let stopped = Command::new("timeout")
            .args(["60", "rabbitmqctl", "-n", &self.node, "shutdown"])
            .output();
        if !stopped.is_ok_and(|o| o.status.success()) {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chown_to_rabbitmq(dir: &Path) {
    let status = Command::new("chown")
        .args(["-R", "rabbitmq:rabbitmq"])
        .arg(dir)
        .status()
        .expect("chown");
    assert!(status.success(), "chown the node's directory");
}
