//! A PostgreSQL primary and its synchronous streaming standby, of one
//! test's own, for a real failover: the primary crashes (`pg_ctl stop -m
//! immediate`), the standby is promoted (`pg_ctl promote`). Same server
//! package as the shared instance (`scripts/services` installs it), its
//! own data directories and ports, run as the `postgres` user when the
//! test runs as root; both stopped when dropped.

use super::pooler::running_as_root;
use super::small_disk::run;
use super::unique;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The pair; both servers are killed and their directory removed when
/// it is dropped.
pub struct PgPair(Servers);

/// Where the two servers live, and what can be done to them.
#[derive(Clone)]
pub struct Servers {
    dir: PathBuf,
    pub primary_port: u16,
    pub standby_port: u16,
}

impl std::ops::Deref for PgPair {
    type Target = Servers;
    fn deref(&self) -> &Servers {
        &self.0
    }
}

impl PgPair {
    /// Starts the primary, copies it into a standby that streams from it,
    /// and waits until the primary counts the standby as synchronous: from
    /// then on every commit dedupq is told of is on both.
    pub async fn start() -> Self {
        let dir = std::env::temp_dir().join(unique("pgpair"));
        std::fs::create_dir_all(&dir).expect("create the pair's directory");
        let me = Self(Servers {
            dir,
            primary_port: super::process::free_port(),
            standby_port: super::process::free_port(),
        });
        let servers = me.0.clone();
        tokio::task::spawn_blocking(move || servers.set_up())
            .await
            .expect("set up the pair");
        me.wait_synchronous().await;
        me
    }
}

impl Servers {
    fn set_up(&self) {
        if running_as_root() {
            run(Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&self.dir));
        }
        let primary = self.data("primary");
        let standby = self.data("standby");
        self.pg(&[
            "initdb",
            "-D",
            path(&primary),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        ]);
        let conf = format!(
            "port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{dir}'\n\
             max_connections = 60\n\
             shared_buffers = 16MB\n\
             wal_level = replica\n\
             max_wal_senders = 4\n\
             synchronous_standby_names = 'standby'\n",
            port = self.primary_port,
            dir = self.dir.display(),
        );
        append(&primary.join("postgresql.conf"), &conf);
        self.start_server(&primary);
        self.pg(&[
            "pg_basebackup",
            "-d",
            &format!(
                "host=127.0.0.1 port={} user=postgres application_name=standby",
                self.primary_port
            ),
            "-D",
            path(&standby),
            "-X",
            "stream",
            "-R",
            "--no-sync",
        ]);
        // Later lines win: the standby's own port, its name on the
        // primary, and no synchronous standby of its own once promoted
        // (its commits would wait for one forever).
        append(
            &standby.join("postgresql.conf"),
            &format!(
                "port = {}\n\
                 primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=standby'\n\
                 synchronous_standby_names = ''\n",
                self.standby_port, self.primary_port
            ),
        );
        self.start_server(&standby);
    }

    async fn wait_synchronous(&self) {
        let url = self.url(self.primary_port);
        super::eventually(
            Duration::from_secs(60),
            "the standby streaming synchronously",
            || async {
                let pool = sqlx::PgPool::connect(&url).await.ok()?;
                let state: Option<String> = sqlx::query_scalar(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'",
                )
                .fetch_optional(&pool)
                .await
                .ok()?;
                pool.close().await;
                (state.as_deref() == Some("sync")).then_some(())
            },
        )
        .await;
    }

    /// A URL of the server on `port`, as the `postgres` superuser.
    pub fn url(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")
    }

    /// The primary dies at once, as on a lost host: no shutdown checkpoint,
    /// every session cut.
    pub fn crash_primary(&self) {
        self.pg(&[
            "pg_ctl",
            "-D",
            path(&self.data("primary")),
            "stop",
            "-m",
            "immediate",
        ]);
    }

    /// The standby becomes the primary; returns once it takes writes.
    pub fn promote_standby(&self) {
        self.pg(&[
            "pg_ctl",
            "-D",
            path(&self.data("standby")),
            "promote",
            "-w",
            "-t",
            "60",
        ]);
    }

    fn data(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn start_server(&self, data: &Path) {
        let log = data.with_extension("log");
        self.pg(&[
            "pg_ctl",
            "-D",
            path(data),
            "-l",
            path(&log),
            "-w",
            "-t",
            "120",
            "start",
        ]);
    }

    /// Runs one of the server's programs, as `postgres` when root.
    fn pg(&self, args: &[&str]) {
        let program = format!("{BIN}/{}", args[0]);
        let mut command = if running_as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &program]);
            c
        } else {
            Command::new(&program)
        };
        command.args(&args[1..]).current_dir(&self.dir);
        run(&mut command);
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for name in ["standby", "primary"] {
            let pid = std::fs::read_to_string(self.0.data(name).join("postmaster.pid"));
            if let Some(pid) = pid.ok().and_then(|p| p.lines().next().map(str::to_string)) {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.0.dir);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .expect("open the server's configuration");
    f.write_all(text.as_bytes())
        .expect("write the server's configuration");
}
