//! What /healthz reports: is every long-running loop still going round?
//! Each loop (the Kafka consumer, each RabbitMQ queue's worker, the store
//! watch) holds a [`Heartbeat`] and beats it every time it goes round, and
//! at least every [`BEAT_EVERY`] while it waits on purpose: for messages
//! (idle), for its running batches (a provider or store outage), or for
//! PostgreSQL. A loop that stops beating for `http.liveness_timeout` is
//! stuck (blocked outside its waits, or its thread is), and /healthz names
//! it. A loop that ends drops its heartbeat and is no longer watched.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often a waiting loop beats: far below any `http.liveness_timeout`
/// accepted (at least 1 s).
pub const BEAT_EVERY: Duration = Duration::from_millis(250);

/// The heartbeats of the running loops, shared with /healthz.
#[derive(Debug, Clone)]
pub struct Liveness(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    start: Instant,
    beats: Mutex<Vec<Weak<Beat>>>,
}

#[derive(Debug)]
struct Beat {
    name: String,
    /// Milliseconds from `Inner::start` to the last beat.
    last: AtomicU64,
}

/// One loop's heartbeat: watched from [`Liveness::register`] until dropped.
#[derive(Debug)]
pub struct Heartbeat {
    beat: Arc<Beat>,
    start: Instant,
}

impl Default for Liveness {
    fn default() -> Self {
        Self(Arc::new(Inner {
            start: Instant::now(),
            beats: Mutex::default(),
        }))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Liveness {
    /// Watches a loop named `name` (as /healthz shows it), beaten now.
    pub fn register(&self, name: impl Into<String>) -> Heartbeat {
        let beat = Arc::new(Beat {
            name: name.into(),
            last: AtomicU64::new(millis(self.0.start.elapsed())),
        });
        let mut beats = self.0.beats.lock().unwrap_or_else(|p| p.into_inner());
        beats.retain(|b| b.strong_count() > 0);
        beats.push(Arc::downgrade(&beat));
        Heartbeat {
            beat,
            start: self.0.start,
        }
    }

    /// The watched loops that have not beaten for longer than `timeout`,
    /// each as "`name`: no heartbeat for `N`s"; empty while all go round.
    pub fn stuck(&self, timeout: Duration) -> Vec<String> {
        let now = millis(self.0.start.elapsed());
        let beats = self.0.beats.lock().unwrap_or_else(|p| p.into_inner());
        beats
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|b| {
                let silent = now.saturating_sub(b.last.load(Ordering::Relaxed));
                (silent > millis(timeout))
                    .then(|| format!("{}: no heartbeat for {}s", b.name, silent / 1000))
            })
            .collect()
    }
}

impl Heartbeat {
    /// The loop went round.
    pub fn beat(&self) {
        let now = millis(self.start.elapsed());
        self.beat.last.store(now, Ordering::Relaxed);
    }

    /// Awaits `work`, a wait the loop makes on purpose (for messages, for
    /// its batches, for a dependency), beating every [`BEAT_EVERY`] while
    /// it lasts. `work` is never cancelled.
    pub async fn waiting<F: Future>(&self, work: F) -> F::Output {
        tokio::pin!(work);
        let mut tick = tokio::time::interval(BEAT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                out = &mut work => {
                    self.beat();
                    return out;
                }
                _ = tick.tick() => self.beat(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_stops_beating_is_named_once_its_silence_exceeds_the_timeout() {
        let liveness = Liveness::default();
        let kafka = liveness.register("kafka consumer");
        let amqp = liveness.register("amqp consumer payments");
        let timeout = Duration::from_secs(2);
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(500)).await;
            kafka.beat();
            amqp.beat();
        }
        assert!(liveness.stuck(timeout).is_empty());
        for _ in 0..6 {
            tokio::time::advance(Duration::from_millis(500)).await;
            kafka.beat();
        }
        assert_eq!(
            liveness.stuck(timeout),
            ["amqp consumer payments: no heartbeat for 3s"]
        );
        drop(amqp);
        assert!(
            liveness.stuck(timeout).is_empty(),
            "an ended loop is not watched"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_on_purpose_keeps_beating() {
        let liveness = Liveness::default();
        let heartbeat = liveness.register("store watch");
        let waited = heartbeat.waiting(tokio::time::sleep(Duration::from_secs(30)));
        let checked = async {
            for _ in 0..29 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert!(liveness.stuck(Duration::from_secs(1)).is_empty());
            }
        };
        tokio::join!(waited, checked);
    }
}
