//! The handler's HTTP client, rebuilt when its TLS files change: a
//! rotated `handler.ca_file` (the provider moved to a new CA) or
//! `handler.client_identity_file` (a renewed client certificate) is in
//! force within seconds, or at once on SIGHUP, without a restart. Files
//! that no longer read or parse keep the client that works, and say so in
//! the log: a half-written certificate never cuts the provider off.

use super::HttpHandlerError;
use crate::config::HandlerSettings;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// What the client is built from.
#[derive(Clone)]
struct Recipe {
    connect_timeout: Duration,
    ca_file: Option<PathBuf>,
    client_identity_file: Option<PathBuf>,
}

struct Inner {
    recipe: Recipe,
    current: RwLock<(reqwest::Client, [u8; 32])>,
}

/// The client in force; cheap to clone, shared with the lookup.
#[derive(Clone)]
pub(super) struct SharedClient(Arc<Inner>);

fn config(setting: &'static str, problem: impl Into<String>) -> HttpHandlerError {
    HttpHandlerError::Config {
        setting,
        problem: problem.into(),
    }
}

impl Recipe {
    /// The TLS files' bytes (the CA, the client identity), each read once.
    fn read(&self) -> Result<[Option<Vec<u8>>; 2], HttpHandlerError> {
        let read = |setting: &'static str, path: &Option<PathBuf>| {
            path.as_ref()
                .map(|p| {
                    std::fs::read(p)
                        .map_err(|e| config(setting, format!("reading {}: {e}", p.display())))
                })
                .transpose()
        };
        Ok([
            read("ca_file", &self.ca_file)?,
            read("client_identity_file", &self.client_identity_file)?,
        ])
    }

    fn build(&self) -> Result<(reqwest::Client, [u8; 32]), HttpHandlerError> {
        let [ca, identity] = self.read()?;
        let mut digest = Sha256::new();
        let mut builder = reqwest::Client::builder()
            // A redirect is a misconfiguration, and following it would turn
            // the charge into a GET without its body.
            .redirect(reqwest::redirect::Policy::none())
            // Refused or unreachable is told apart from a slow provider:
            // connecting is bounded on its own, well inside the timeout.
            .connect_timeout(self.connect_timeout)
            // Keep connections warm for the next messages of the batch.
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true);
        if let Some(pem) = ca {
            digest.update(&pem);
            let ca = reqwest::Certificate::from_pem(&pem)
                .map_err(|_| config("ca_file", "is not a PEM certificate"))?;
            builder = builder.add_root_certificate(ca);
        }
        digest.update(b"\0identity\0");
        if let Some(pem) = identity {
            digest.update(&pem);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                config(
                    "client_identity_file",
                    "must hold a PEM certificate and its private key",
                )
            })?;
            builder = builder.identity(identity);
        }
        let client = builder.build().map_err(HttpHandlerError::Client)?;
        Ok((client, digest.finalize().into()))
    }
}

impl SharedClient {
    /// Builds the client from `s`; a TLS file that cannot be used stops
    /// start-up.
    pub(super) fn new(s: &HandlerSettings) -> Result<Self, HttpHandlerError> {
        let recipe = Recipe {
            connect_timeout: s.timeout.min(Duration::from_secs(2)),
            ca_file: s.ca_file.clone(),
            client_identity_file: s.client_identity_file.clone(),
        };
        let current = RwLock::new(recipe.build()?);
        Ok(Self(Arc::new(Inner { recipe, current })))
    }

    /// The client in force.
    pub(super) fn get(&self) -> reqwest::Client {
        self.0
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// Reads the TLS files again: `Ok(true)` if they changed and a client
    /// built from them is in force, `Ok(false)` if unchanged, an error (the
    /// client in force stays) if they cannot be used.
    pub(super) fn reload(&self) -> Result<bool, HttpHandlerError> {
        let (client, digest) = self.0.recipe.build()?;
        let mut current = self.0.current.write().unwrap_or_else(|e| e.into_inner());
        if current.1 == digest {
            return Ok(false);
        }
        *current = (client, digest);
        Ok(true)
    }

    /// Watches the TLS files (see `recheck`: every 2 s and on SIGHUP) for as
    /// long as the handler lives; nothing to watch without them.
    pub(super) fn watch(&self) {
        let recipe = &self.0.recipe;
        if recipe.ca_file.is_none() && recipe.client_identity_file.is_none() {
            return;
        }
        let weak = Arc::downgrade(&self.0);
        tokio::spawn(watch(weak));
    }
}

async fn watch(weak: Weak<Inner>) {
    let mut recheck = crate::recheck::Recheck::new();
    loop {
        recheck.next().await;
        let Some(inner) = weak.upgrade() else { return };
        match SharedClient(inner).reload() {
            Ok(true) => tracing::info!(
                "handler TLS files changed (handler.ca_file, handler.client_identity_file): new connections use them"
            ),
            Ok(false) => {}
            Err(e) => tracing::error!(
                error = %crate::telemetry::chain(&e),
                "handler TLS files changed but cannot be used: the previous ones stay in force"
            ),
        }
    }
}
