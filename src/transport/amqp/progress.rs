//! Whether each queue makes progress: deliveries in hand and the last ack,
//! and how long sessions have been failing. A queue with waiting work and
//! no ack for `amqp.stall_after` is reported stalled on /readyz and in
//! `dedupq_stalled_lanes`.

use crate::health::{Component, Health};
use crate::message::Transport;
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Default)]
pub(super) struct Progress {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Queue>,
    /// Since when no session stayed up long enough to ack anything.
    failing_since: Option<(Instant, String)>,
    /// When the current session started consuming (None: no session).
    up_since: Option<Instant>,
    /// Why RabbitMQ blocks the current session's connection, if it does.
    blocked: Option<String>,
}

struct Queue {
    unacked: usize,
    last_ack: Instant,
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A batch of `n` deliveries was taken from `queue`.
    pub(super) fn taken(&self, queue: &str, n: usize) {
        let mut s = self.lock();
        let q = s.queues.entry(queue.to_string()).or_insert_with(|| Queue {
            unacked: 0,
            last_ack: Instant::now(),
        });
        if q.unacked == 0 {
            q.last_ack = Instant::now();
        }
        q.unacked += n;
    }

    /// `acked` of `n` taken deliveries were acked (the rest come back).
    pub(super) fn settled(&self, queue: &str, n: usize, acked: usize) {
        let mut s = self.lock();
        if acked > 0 {
            s.failing_since = None;
        }
        if let Some(q) = s.queues.get_mut(queue) {
            q.unacked = q.unacked.saturating_sub(n);
            if acked > 0 {
                q.last_ack = Instant::now();
            }
        }
    }

    /// A session started consuming.
    pub(super) fn session_up(&self) {
        self.lock().up_since = Some(Instant::now());
    }

    /// RabbitMQ blocked the connection (`Some(reason)`, a resource alarm)
    /// or unblocked it (`None`).
    pub(super) fn blocked(&self, reason: Option<String>) {
        self.lock().blocked = reason;
    }

    /// A session ended with `error`.
    pub(super) fn session_failed(&self, error: &str) {
        let mut s = self.lock();
        s.up_since = None;
        s.blocked = None;
        s.failing_since
            .get_or_insert_with(|| (Instant::now(), String::new()))
            .1 = error.to_string();
        for q in s.queues.values_mut() {
            q.unacked = 0;
        }
    }

    /// The stalled queues, each with why.
    pub(super) fn stalled(&self, queues: &[String], after: Duration) -> Vec<String> {
        let mut s = self.lock();
        let now = Instant::now();
        // A session that has lasted `after` ends the failing stretch, even
        // with nothing to ack (an empty queue once the poison is gone).
        if s.up_since
            .is_some_and(|up| now.saturating_duration_since(up) >= after)
        {
            s.failing_since = None;
        }
        let mut out = Vec::new();
        if let Some((since, error)) = &s.failing_since {
            let failing = now.saturating_duration_since(*since);
            if failing >= after {
                for queue in queues {
                    out.push(format!(
                        "{queue}: no RabbitMQ session has lasted for {}s (last error: {error})",
                        failing.as_secs()
                    ));
                }
                return out;
            }
        }
        // Acks wait while RabbitMQ blocks the connection: the cause of a
        // stall, named on each line.
        let cause = s
            .blocked
            .as_ref()
            .map(|r| format!(" (RabbitMQ blocks the connection: {r})"))
            .unwrap_or_default();
        for (name, q) in &s.queues {
            let idle = now.saturating_duration_since(q.last_ack);
            if q.unacked > 0 && idle >= after {
                out.push(format!(
                    "{name}: {} deliveries in hand and no ack for {}s{cause}",
                    q.unacked,
                    idle.as_secs()
                ));
            }
        }
        out.sort();
        out
    }

    pub(super) fn report(
        &self,
        queues: &[String],
        after: Duration,
        health: &Health,
        metrics: &Metrics,
    ) {
        let stalled = self.stalled(queues, after);
        metrics
            .stalled_lanes
            .with_label_values(&[Transport::Amqp.label()])
            .set(stalled.len() as i64);
        if !stalled.is_empty() {
            tracing::warn!(queues = ?stalled, "stalled queues");
        }
        health.set_stalled(Component::Amqp, stalled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_queue_with_work_and_no_ack_is_stalled_until_an_ack() {
        let p = Progress::default();
        let queues = vec!["q".to_string()];
        p.taken("q", 3);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(p.stalled(&queues, Duration::from_secs(60)).len(), 1);
        p.settled("q", 3, 3);
        assert!(p.stalled(&queues, Duration::from_secs(60)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_while_rabbitmq_blocks_the_connection_names_the_alarm_until_unblocked() {
        let p = Progress::default();
        let queues = vec!["q".to_string()];
        p.taken("q", 2);
        p.blocked(Some("low on memory".into()));
        tokio::time::advance(Duration::from_secs(61)).await;
        let lines = p.stalled(&queues, Duration::from_secs(60));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].ends_with("(RabbitMQ blocks the connection: low on memory)"),
            "{lines:?}"
        );
        p.blocked(None);
        let lines = p.stalled(&queues, Duration::from_secs(60));
        assert!(!lines[0].contains("RabbitMQ blocks"), "{lines:?}");
        p.blocked(Some("low on disk".into()));
        p.session_failed("connection reset");
        p.taken("q", 1);
        tokio::time::advance(Duration::from_secs(61)).await;
        let lines = p.stalled(&queues, Duration::from_secs(60));
        assert!(
            lines.iter().all(|l| !l.contains("RabbitMQ blocks")),
            "a new session is not blocked: {lines:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_that_keep_failing_stall_every_queue() {
        let p = Progress::default();
        let queues = vec!["a".to_string(), "b".to_string()];
        p.session_failed("frame error");
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(p.stalled(&queues, Duration::from_secs(60)).is_empty());
        p.session_failed("frame error");
        tokio::time::advance(Duration::from_secs(31)).await;
        let stalled = p.stalled(&queues, Duration::from_secs(60));
        assert_eq!(stalled.len(), 2);
        assert!(stalled[0].contains("frame error"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_lasts_ends_the_failing_stretch_with_nothing_to_ack() {
        let p = Progress::default();
        let queues = vec!["q".to_string()];
        let after = Duration::from_secs(60);
        p.session_failed("frame error");
        tokio::time::advance(Duration::from_secs(61)).await;
        p.session_up();
        assert_eq!(p.stalled(&queues, after).len(), 1, "just started");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(
            p.stalled(&queues, after).is_empty(),
            "lasted, nothing in hand"
        );
        p.session_failed("frame error");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(p.stalled(&queues, after).len(), 1, "failing again");
    }
}
