//! Provider-wide outages. When the provider refuses, fails or times out
//! for several different keys in a row, or answers 429/503 with
//! `Retry-After`, the trouble is the provider's, not the payments': intake
//! pauses (as for a PostgreSQL outage), one probe request at a time tests
//! the provider, and intake resumes when it answers. Meanwhile no payment
//! uses up an attempt, and the time paused does not count against
//! `handler.retry_for`.

use crate::backoff::Backoff;
use crate::handler::HandlerOutcome;
use crate::health::{Component, Health};
use crate::identity::Identity;
use crate::metrics::Metrics;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The longest `Retry-After` honoured; a longer one is probed sooner.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Pauses remembered for `paused_within` (older ones are dropped first).
const PAUSES_KEPT: usize = 256;

/// What one finished handler call says about the provider as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// It answered about the payment (done or refused): it works.
    Answered,
    /// Refused, failed, timed out or pointed at a misconfiguration.
    Failing {
        /// What the provider asked for (a 429 or 503 with `Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Says nothing about the provider (a 409 for a key still running,
    /// a 422, a lost lease).
    Neutral,
}

impl Signal {
    pub(super) fn of(outcome: &HandlerOutcome) -> Signal {
        match outcome {
            HandlerOutcome::Success(_) | HandlerOutcome::Permanent(_) => Signal::Answered,
            HandlerOutcome::Transient {
                status: Some(408 | 409 | 422),
                ..
            } => Signal::Neutral,
            HandlerOutcome::Transient { retry_after, .. } => Signal::Failing {
                retry_after: *retry_after,
            },
            HandlerOutcome::Unknown { .. } | HandlerOutcome::Fault { .. } => {
                Signal::Failing { retry_after: None }
            }
        }
    }
}

/// May a handler call start now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// The provider is up.
    Go,
    /// Paused: this call is the one probe; report how it went.
    Probe,
    /// Paused: try again after this long.
    Wait(Duration),
}

pub(super) struct ProviderGate {
    state: Mutex<State>,
    /// Distinct keys failing in a row that make an outage.
    threshold: usize,
    /// Waits between probes, growing while they fail.
    backoff: Backoff,
    metrics: Metrics,
    health: Health,
}

#[derive(Default)]
struct State {
    /// Keys whose calls failed since the last answer, each once.
    failing: Vec<Identity>,
    open: Option<Open>,
    /// Ended pauses (start, end), newest last.
    pauses: VecDeque<(Instant, Instant)>,
}

struct Open {
    since: Instant,
    next_probe: Instant,
    probing: bool,
    probes: u32,
}

impl ProviderGate {
    pub(super) fn new(
        threshold: usize,
        backoff: Backoff,
        metrics: Metrics,
        health: Health,
    ) -> Self {
        Self {
            state: Mutex::default(),
            threshold: threshold.max(1),
            backoff,
            metrics,
            health,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a call may start now (and, if paused, whether it is the
    /// probe).
    pub(super) fn admit(&self) -> Admit {
        let mut state = self.state();
        let now = Instant::now();
        match &mut state.open {
            None => Admit::Go,
            Some(open) if open.probing || now < open.next_probe => Admit::Wait(
                open.next_probe
                    .saturating_duration_since(now)
                    .max(self.backoff.min),
            ),
            Some(open) => {
                open.probing = true;
                Admit::Probe
            }
        }
    }

    /// None while the provider is up; else how long until the next probe
    /// may start (zero: one may start now).
    pub(super) fn paused(&self) -> Option<Duration> {
        let state = self.state();
        let open = state.open.as_ref()?;
        Some(if open.probing {
            self.backoff.min
        } else {
            open.next_probe.saturating_duration_since(Instant::now())
        })
    }

    /// Learns from a finished call (`probe`: the one `admit` let through
    /// while paused).
    pub(super) fn report(&self, identity: &Identity, signal: Signal, probe: bool) {
        let mut state = self.state();
        let now = Instant::now();
        match signal {
            Signal::Answered => {
                state.failing.clear();
                if let Some(open) = state.open.take() {
                    state.pauses.push_back((open.since, now));
                    while state.pauses.len() > PAUSES_KEPT {
                        state.pauses.pop_front();
                    }
                    self.metrics.handler_paused.set(0);
                    self.health.set(Component::Handler, true);
                    tracing::info!(paused = ?now - open.since, "the provider answers again: intake resumed");
                }
            }
            Signal::Failing { retry_after } => {
                let asked = retry_after.map(|d| d.min(MAX_RETRY_AFTER));
                if let Some(open) = &mut state.open {
                    if probe {
                        open.probing = false;
                        open.probes = open.probes.saturating_add(1);
                        let wait = self.backoff.after_attempt(open.probes);
                        open.next_probe = now + asked.map_or(wait, |a| a.max(wait));
                    }
                    return;
                }
                if !state.failing.contains(identity) {
                    state.failing.push(identity.clone());
                }
                if asked.is_some() || state.failing.len() >= self.threshold {
                    let keys = state.failing.len();
                    state.failing.clear();
                    state.open = Some(Open {
                        since: now,
                        next_probe: now + asked.unwrap_or(self.backoff.min),
                        probing: false,
                        probes: 0,
                    });
                    self.metrics.handler_paused.set(1);
                    let reason = match asked {
                        Some(d) => format!(
                            "provider outage: it asked to retry after {}; intake paused, probing",
                            humantime::format_duration(d)
                        ),
                        None => format!(
                            "provider outage: {keys} different keys failed in a row; intake paused, probing"
                        ),
                    };
                    tracing::warn!(%reason, "pausing intake");
                    self.health.set_down(Component::Handler, reason);
                }
            }
            Signal::Neutral => {
                if let (Some(open), true) = (&mut state.open, probe) {
                    open.probing = false;
                }
            }
        }
    }

    /// How much of the last `window` intake was paused.
    pub(super) fn paused_within(&self, window: Duration) -> Duration {
        let state = self.state();
        let now = Instant::now();
        let from = now.checked_sub(window).unwrap_or(now);
        let open = state.open.as_ref().map(|o| (o.since, now));
        state
            .pauses
            .iter()
            .copied()
            .chain(open)
            .map(|(start, end)| end.saturating_duration_since(start.max(from)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{IdempotencyKey, Tenant};

    fn id(k: &str) -> Identity {
        Identity {
            tenant: Tenant::parse(b"t").unwrap(),
            key: IdempotencyKey::parse(k.as_bytes()).unwrap(),
        }
    }

    fn gate() -> ProviderGate {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(4));
        ProviderGate::new(3, backoff, Metrics::new(), Health::default())
    }

    const FAILING: Signal = Signal::Failing { retry_after: None };

    #[test]
    fn failures_of_one_key_are_its_own_and_of_three_keys_an_outage() {
        let g = gate();
        for _ in 0..10 {
            g.report(&id("a"), FAILING, false);
        }
        assert_eq!(g.admit(), Admit::Go, "one key failing is not an outage");
        g.report(&id("b"), FAILING, false);
        g.report(&id("a"), Signal::Answered, false);
        g.report(&id("c"), FAILING, false);
        assert_eq!(g.admit(), Admit::Go, "an answer in between ends the streak");
        g.report(&id("d"), FAILING, false);
        g.report(&id("e"), FAILING, false);
        assert!(matches!(g.admit(), Admit::Wait(_) | Admit::Probe));
        assert_eq!(g.metrics.handler_paused.get(), 1);
    }

    #[test]
    fn one_probe_at_a_time_and_an_answer_resumes_intake() {
        let g = gate();
        g.report(
            &id("a"),
            Signal::Failing {
                retry_after: Some(Duration::ZERO),
            },
            false,
        );
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(g.admit(), Admit::Probe);
        assert!(matches!(g.admit(), Admit::Wait(_)), "a second call waits");
        g.report(&id("b"), FAILING, true);
        assert!(
            matches!(g.admit(), Admit::Wait(_)),
            "the failed probe backs off"
        );
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(g.admit(), Admit::Probe);
        g.report(&id("b"), Signal::Answered, true);
        assert_eq!(g.admit(), Admit::Go);
        assert_eq!(g.metrics.handler_paused.get(), 0);
        assert!(g.paused_within(Duration::from_secs(60)) >= Duration::from_millis(10));
    }
}
