//! What /readyz reports: is the store reachable, are the brokers connected,
//! and if not, why. It also carries the loops' heartbeats /healthz checks
//! (see [`crate::liveness`]), so every part that reports readiness can beat.

use crate::liveness::Liveness;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a failed key-table write keeps the store not ready when no
/// write comes after it (no traffic): long enough to be seen, short enough
/// that an idle replica is taken back into service.
const WRITE_FAILURE_HOLD: Duration = Duration::from_secs(15);

const OFF: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// A part of the service whose state /readyz reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// PostgreSQL: down until the store is prepared at start-up, then
    /// pinged every second.
    Store,
    /// The Kafka transport, when topics are configured: up while librdkafka
    /// reports a broker connection up.
    Kafka,
    /// The RabbitMQ transport, when queues are configured: up while its
    /// connection is open.
    Amqp,
    /// Down while the handler's answers say dedupq is misconfigured (401,
    /// 404, redirects), until a handler run ends in anything but such a
    /// fault.
    Handler,
}

impl Component {
    /// Every component, in the order /readyz lists them.
    pub const ALL: [Component; 4] = [
        Component::Store,
        Component::Kafka,
        Component::Amqp,
        Component::Handler,
    ];

    /// The component's name in the /readyz body.
    pub fn name(self) -> &'static str {
        match self {
            Component::Store => "store",
            Component::Kafka => "kafka",
            Component::Amqp => "amqp",
            Component::Handler => "handler",
        }
    }
}

/// Shared readiness flags. A component that is not configured stays off and
/// does not count against readiness. A component that is down may say why,
/// and a transport may report stalled lanes (partitions or queues with
/// waiting messages and no progress): that makes it not ready, with the
/// lanes named.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    state: [AtomicU8; 4],
    /// Why a component is down, when its owner said.
    reasons: Mutex<[Option<String>; 4]>,
    stalled: Mutex<[Vec<String>; 4]>,
    /// The last key-table write that failed for an outage (a read-only
    /// server, a timeout, no disk), until a write works again.
    write_failure: Mutex<Option<(String, Instant)>>,
    liveness: Liveness,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Health {
    /// The heartbeats of the long-running loops (/healthz).
    pub fn liveness(&self) -> &Liveness {
        &self.0.liveness
    }

    /// Marks `c` up or down, and so configured; clears the reason given
    /// before.
    pub fn set(&self, c: Component, up: bool) {
        self.0.state[c as usize].store(if up { UP } else { DOWN }, Ordering::Relaxed);
        lock(&self.0.reasons)[c as usize] = None;
    }

    /// Down, with a reason /readyz shows (e.g. `unreachable: <cause>`).
    pub fn set_down(&self, c: Component, reason: impl Into<String>) {
        self.0.state[c as usize].store(DOWN, Ordering::Relaxed);
        lock(&self.0.reasons)[c as usize] = Some(reason.into());
    }

    /// None: not configured; Some(up).
    pub fn get(&self, c: Component) -> Option<bool> {
        match self.0.state[c as usize].load(Ordering::Relaxed) {
            OFF => None,
            v => Some(v == UP),
        }
    }

    /// Why `c` is down, if its owner said (see [`Health::set_down`]).
    pub fn reason(&self, c: Component) -> Option<String> {
        lock(&self.0.reasons)[c as usize].clone()
    }

    /// Replaces the stalled lanes `c` reports (each a line saying which
    /// and why).
    pub fn set_stalled(&self, c: Component, lanes: Vec<String>) {
        lock(&self.0.stalled)[c as usize] = lanes;
    }

    /// The stalled lanes `c` reports now; empty when it has none.
    pub fn stalled(&self, c: Component) -> Vec<String> {
        lock(&self.0.stalled)[c as usize].clone()
    }

    /// A key-table write failed for an outage: the store is not ready,
    /// with the SQLSTATE, until a write works again (or, with no write
    /// coming, for `WRITE_FAILURE_HOLD`). The ping alone cannot see a
    /// statement timeout or a full disk.
    pub fn store_writes_failed(&self, e: &crate::store::StoreError) {
        let code = e.sqlstate().unwrap_or_else(|| e.class().to_string());
        let reason = format!("writes failing ({code}): {}", crate::telemetry::chain(e));
        *lock(&self.0.write_failure) = Some((reason, Instant::now()));
    }

    /// A key-table write went through.
    pub fn store_writes_work(&self) {
        let mut failure = lock(&self.0.write_failure);
        if failure.is_some() {
            *failure = None;
        }
    }

    /// Why writes fail now, if they do.
    pub fn store_write_failure(&self) -> Option<String> {
        lock(&self.0.write_failure)
            .as_ref()
            .filter(|(_, at)| at.elapsed() < WRITE_FAILURE_HOLD)
            .map(|(reason, _)| reason.clone())
    }

    /// What /readyz answers 200 for: the store up and its writes working,
    /// no configured component down, no stalled lane.
    pub fn ready(&self) -> bool {
        Component::ALL.iter().all(|c| self.get(*c) != Some(false))
            && self.get(Component::Store) == Some(true)
            && self.store_write_failure().is_none()
            && lock(&self.0.stalled).iter().all(Vec::is_empty)
    }
}
