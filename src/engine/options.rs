//! The engine's runtime options, derived from the configuration, and the
//! owner name of this process.

pub use crate::backoff::Backoff;
use crate::config::Settings;
use rand::Rng;
use std::time::Duration;

/// Runtime knobs of the engine, derived from the configuration.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Written into claimed rows; names this process in `keys show`.
    pub owner: String,
    /// How long a claim is exclusive without renewal (`engine.lease`).
    pub lease: Duration,
    /// How often running handlers' leases are renewed
    /// (`engine.renew_every`).
    pub renew_every: Duration,
    /// The longest handler run (`handler.timeout`); past it the leased
    /// engine records the outcome unknown. The same-database engine only
    /// passes it on as the call's deadline.
    pub handler_timeout: Duration,
    /// Handler runs at once in this process (`engine.concurrency`); the
    /// same-database engine runs up to this many transactions of a batch
    /// at once.
    pub concurrency: usize,
    /// Attempts before a transient failure or an unknown outcome is final
    /// (`engine.max_attempts`).
    pub max_attempts: u32,
    /// Waits between retries (`engine.retry_backoff_min` to
    /// `engine.retry_backoff_max`).
    pub backoff: Backoff,
    /// Most messages in one claim statement (`engine.max_batch`).
    pub max_batch: usize,
    /// How long a key's attempts go on (`handler.retry_for`), paused time
    /// not counted.
    pub retry_for: Duration,
    /// Different keys failing in a row that make a provider outage
    /// (`handler.outage_after`).
    pub outage_after: usize,
}

impl EngineOptions {
    /// The options `[engine]` and `handler.timeout` set; without
    /// `engine.owner`, the owner is [`default_owner`].
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
            retry_for: s.handler.retry_for,
            outage_after: s.handler.outage_after,
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
