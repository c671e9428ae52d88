//! Credentials read from files (the API keys file, webhook secret files)
//! are read again when they change and on SIGHUP, so rotating one needs no
//! restart. A file that no longer reads or parses keeps the credentials it
//! held, and says so in the log: a half-written file never locks callers
//! out.

use crate::config::ConfigError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

type Parse<T> = Box<dyn Fn(&Path, &str) -> Result<T, ConfigError> + Send + Sync>;

/// What was read from the file last, and its digest.
struct Read<T> {
    digest: [u8; 32],
    value: Arc<T>,
}

/// A value parsed from a file, replaced when the file changes.
pub(super) struct FileBacked<T> {
    path: PathBuf,
    /// The setting that names the file, for the log.
    setting: String,
    parse: Parse<T>,
    current: RwLock<Read<T>>,
}

impl<T> FileBacked<T> {
    /// Reads and parses `path` (named by `setting`); an error stops start-up.
    pub(super) fn load(
        setting: &str,
        path: &Path,
        parse: impl Fn(&Path, &str) -> Result<T, ConfigError> + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        let text = read(setting, path)?;
        let value = parse(path, &text)?;
        Ok(Self {
            path: path.to_path_buf(),
            setting: setting.to_string(),
            parse: Box::new(parse),
            current: RwLock::new(Read {
                digest: Sha256::digest(text.as_bytes()).into(),
                value: Arc::new(value),
            }),
        })
    }

    /// The value in force.
    pub(super) fn get(&self) -> Arc<T> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.value.clone()
    }

    /// Reads the file again: `Ok(true)` if it changed and the new value is
    /// in force, `Ok(false)` if it is unchanged, an error (the old value
    /// stays) if it cannot be read or parsed.
    pub(super) fn reload(&self) -> Result<bool, ConfigError> {
        let text = read(&self.setting, &self.path)?;
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        if self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .digest
            == digest
        {
            return Ok(false);
        }
        let value = (self.parse)(&self.path, &text)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Read {
            digest,
            value: Arc::new(value),
        };
        Ok(true)
    }

    /// Reloads and logs what happened; the setting's name, never content.
    pub(super) fn reload_logged(&self) {
        match self.reload() {
            Ok(true) => {
                tracing::info!(setting = %self.setting, path = %self.path.display(), "credentials file changed: reloaded")
            }
            Ok(false) => {}
            Err(e) => tracing::error!(
                setting = %self.setting,
                error = %e,
                "credentials file changed but cannot be used: the previous credentials stay in force"
            ),
        }
    }
}

fn read(setting: &str, path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            setting,
            format!("cannot read {}: {e}", path.display()),
            "make the file readable by dedupq",
        )
    })
}

/// Calls `reload` on the `recheck` schedule (every 2 s, and on each SIGHUP), until
/// `shutdown`.
pub(super) async fn watch(reload: impl Fn() + Send + 'static, shutdown: CancellationToken) {
    let mut recheck = crate::recheck::Recheck::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            hangup = recheck.next() => if hangup {
                tracing::info!("SIGHUP: reading credential files again");
            },
        }
        reload();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(_: &Path, text: &str) -> Result<Vec<u32>, ConfigError> {
        text.split_whitespace()
            .map(|n| {
                n.parse()
                    .map_err(|_| ConfigError::new("x", "not a number", "fix it"))
            })
            .collect()
    }

    #[test]
    fn a_changed_file_replaces_the_value_and_a_broken_one_keeps_the_old() {
        let dir = std::env::temp_dir().join(format!("dedupq-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("values");
        std::fs::write(&path, "1 2").unwrap();
        let held = FileBacked::load("x", &path, numbers).unwrap();
        assert_eq!(*held.get(), vec![1, 2]);
        assert!(!held.reload().unwrap(), "unchanged");
        std::fs::write(&path, "3").unwrap();
        assert!(held.reload().unwrap());
        assert_eq!(*held.get(), vec![3]);
        std::fs::write(&path, "3 half-writ").unwrap();
        assert!(held.reload().is_err());
        assert_eq!(*held.get(), vec![3], "the old value stays");
        std::fs::remove_file(&path).unwrap();
        assert!(held.reload().is_err());
        assert_eq!(*held.get(), vec![3]);
    }
}
