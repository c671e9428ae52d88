//! When files named in the configuration (credentials, certificates) are
//! read again: every [`EVERY`], and at once on SIGHUP. One schedule for the
//! API's credential files, the handler's TLS files and Kafka's TLS and
//! SASL files, so an operator rotating any of them meets the same rule.

use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{Interval, MissedTickBehavior};

/// How often the files are compared with what was read last.
pub(crate) const EVERY: Duration = Duration::from_secs(2);

/// The schedule of one watcher.
pub(crate) struct Recheck {
    tick: Interval,
    hangup: Option<Signal>,
}

impl Recheck {
    /// Starts the schedule; the first check is at once.
    pub(crate) fn new() -> Self {
        let hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "SIGHUP cannot be watched; files are still checked every {EVERY:?}");
                None
            }
        };
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self { tick, hangup }
    }

    /// Waits for the next check; true if a SIGHUP asked for it.
    pub(crate) async fn next(&mut self) -> bool {
        let hangup = async {
            match self.hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.tick.tick() => false,
            Some(()) = hangup => true,
        }
    }
}
