//! A PostgreSQL whose disk fills up, for one test's schema only: a
//! tablespace on a small tmpfs of its own (mounted here; the server runs
//! on this machine, as root may mount), the schema's tables and indexes
//! moved onto it, and a file that takes the room that is left. PostgreSQL
//! then fails every write that needs a new page with `could not extend
//! file … No space left on device` (SQLSTATE 53100), as on a full disk.
//! Other tests' schemas, and the write-ahead log, stay on the real disk.

use super::{database_url, unique};
use sqlx::{Executor, PgPool};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// Where the tmpfs mounts go (`scripts/services sweep` unmounts leftovers).
const MOUNTS: &str = "/var/tmp/dedupq-test-disks";

pub struct SmallDisk {
    tablespace: String,
    mount: PathBuf,
    admin: PgPool,
}

impl SmallDisk {
    /// Mounts a tmpfs of `megabytes` for PostgreSQL and makes it a
    /// tablespace.
    pub async fn mount(megabytes: u32) -> Self {
        let name = unique("dq_disk");
        let mount = PathBuf::from(MOUNTS).join(&name);
        std::fs::create_dir_all(&mount).expect("create the mount point");
        let (uid, gid) = (id("-u"), id("-g"));
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={megabytes}m,mode=0700,uid={uid},gid={gid}"))
            .arg(&name)
            .arg(&mount));
        let admin = PgPool::connect(&database_url()).await.expect("admin pool");
        admin
            .execute(format!("CREATE TABLESPACE {name} LOCATION '{}'", mount.display()).as_str())
            .await
            .expect("create the tablespace");
        Self {
            tablespace: name,
            mount,
            admin,
        }
    }

    /// Moves every table and index of `schema` onto this disk.
    pub async fn take(&self, schema: &str) {
        let relations: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.relname::text, c.relkind::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'i', 'p')",
        )
        .bind(schema)
        .fetch_all(&self.admin)
        .await
        .expect("list the schema's relations");
        assert!(!relations.is_empty(), "schema {schema} has no tables");
        for (name, kind) in relations {
            // A partitioned table holds no rows: its setting is where
            // partitions created later go.
            let what = if kind == "i" { "INDEX" } else { "TABLE" };
            let sql = format!(
                "ALTER {what} \"{schema}\".\"{name}\" SET TABLESPACE {}",
                self.tablespace
            );
            self.admin
                .execute(sql.as_str())
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    /// Takes all the room left on the disk.
    pub fn fill(&self) {
        let mut filler = std::fs::File::create(self.filler()).expect("create the filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match filler.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        let _ = filler.flush();
    }

    /// Gives the room back.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }

    fn filler(&self) -> PathBuf {
        self.mount.join("filler")
    }

    /// Drops `schema` (its tables are on this disk), the tablespace, and
    /// unmounts the disk.
    pub async fn remove(self, schema: &str) {
        self.admin
            .execute(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str())
            .await
            .expect("drop the schema");
        self.admin
            .execute(format!("DROP TABLESPACE {}", self.tablespace).as_str())
            .await
            .expect("drop the tablespace");
        run(Command::new("umount").arg(&self.mount));
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// The PostgreSQL server's user or group id (`id -u postgres`).
fn id(flag: &str) -> String {
    let out = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .expect("run id");
    assert!(out.status.success(), "no user postgres on this machine");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `command` to its end; panics with its output if it fails.
pub(super) fn run(command: &mut Command) {
    let out = command.output().expect("run the command");
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
