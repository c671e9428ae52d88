pub use crate::backoff::Backoff;
use crate::config::Settings;
use rand::Rng;
use std::time::Duration;

/// Runtime knobs of the engine, derived from the configuration.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Written into claimed rows; names this process in `keys show`.
    pub owner: String,
    pub lease: Duration,
    pub renew_every: Duration,
    pub handler_timeout: Duration,
    pub concurrency: usize,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub max_batch: usize,
}

impl EngineOptions {
    pub fn from_settings(s: &Settings) -> Self {
        let e = &s.engine;
        Self {
            owner: e.owner.clone().unwrap_or_else(default_owner),
            lease: e.lease,
            renew_every: e.renew_every,
            handler_timeout: s.handler.timeout,
            concurrency: e.concurrency,
            max_attempts: e.max_attempts,
            backoff: Backoff {
                min: e.retry_backoff_min,
                max: e.retry_backoff_max,
            },
            max_batch: e.max_batch,
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self::from_settings(&Settings::default())
    }
}

/// host-pid-random: unique per process start, readable in `keys show`.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let nonce: u32 = rand::rng().random();
    format!("{host}-{}-{nonce:08x}", std::process::id())
}
