//! A real PgBouncer in front of the shared PostgreSQL, one per test: its own
//! port, configuration and log, stopped when dropped. `scripts/services`
//! installs the package; the test starts the binary itself.

use super::unique;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct PgBouncer {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl PgBouncer {
    /// PgBouncer with `pool_mode` (`session`, `transaction`) and its other
    /// settings at their defaults, letting in the users of `urls` (with
    /// their passwords) and passing them on to the PostgreSQL of each URL.
    pub async fn start(pool_mode: &str, urls: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(unique("pgbouncer"));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let mut users = String::new();
        let mut server = None;
        for url in urls {
            let u = url::Url::parse(url).expect("a PostgreSQL URL");
            let password = u.password().expect("a password in the URL");
            users.push_str(&format!("\"{}\" \"{password}\"\n", u.username()));
            server.get_or_insert((
                u.host_str().expect("a host").to_owned(),
                u.port().unwrap_or(5432),
            ));
        }
        let (host, server_port) = server.expect("at least one URL");
        let users_file = dir.join("users.txt");
        std::fs::write(&users_file, users).expect("write users");
        let port = super::process::free_port();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host={host} port={server_port}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = plain\nauth_file = {users}\n\
                 pool_mode = {pool_mode}\n",
                users = users_file.display(),
            ),
        )
        .expect("write pgbouncer.ini");
        let log = dir.join("pgbouncer.log");
        let out = std::fs::File::create(&log).expect("create log");
        let mut command = Command::new("pgbouncer");
        // It refuses to run as root; the PostgreSQL package's user reads
        // the (world-readable) files above.
        if running_as_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone log"))
            .stderr(out)
            .spawn()
            .expect("spawn pgbouncer (scripts/services installs it)");
        let mut me = Self { child, port, log };
        me.wait_listening().await;
        me
    }

    /// `url` with PgBouncer's address in place of PostgreSQL's.
    pub fn url(&self, url: &str) -> String {
        let mut u = url::Url::parse(url).expect("a PostgreSQL URL");
        u.set_host(Some("127.0.0.1")).expect("set host");
        u.set_port(Some(self.port)).expect("set port");
        u.to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_listening(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().ok().flatten() {
                panic!("pgbouncer exited with {status}:\n{}", self.log());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pgbouncer not listening in 20 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this process runs as root (services then run as their own
/// package's user).
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}
