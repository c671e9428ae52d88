//! What /readyz reports: is the store reachable, are the brokers connected.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const OFF: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Store,
    Kafka,
    Amqp,
    /// Down while the handler's answers say dedupq is misconfigured (401,
    /// 404, redirects), until a call succeeds again.
    Handler,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Store,
        Component::Kafka,
        Component::Amqp,
        Component::Handler,
    ];

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
/// does not count against readiness. A transport may also report stalled
/// lanes (partitions or queues with waiting messages and no progress):
/// that makes it not ready, with the lanes named.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    flags: [AtomicU8; 4],
    stalled: Mutex<[Vec<String>; 4]>,
}

impl Health {
    pub fn set(&self, c: Component, up: bool) {
        self.0.flags[c as usize].store(if up { UP } else { DOWN }, Ordering::Relaxed);
    }

    /// None: not configured; Some(up).
    pub fn get(&self, c: Component) -> Option<bool> {
        match self.0.flags[c as usize].load(Ordering::Relaxed) {
            OFF => None,
            v => Some(v == UP),
        }
    }

    /// Replaces the stalled lanes `c` reports (each a line saying which
    /// and why).
    pub fn set_stalled(&self, c: Component, lanes: Vec<String>) {
        self.stalled_lock()[c as usize] = lanes;
    }

    pub fn stalled(&self, c: Component) -> Vec<String> {
        self.stalled_lock()[c as usize].clone()
    }

    fn stalled_lock(&self) -> std::sync::MutexGuard<'_, [Vec<String>; 4]> {
        self.0.stalled.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ready(&self) -> bool {
        Component::ALL.iter().all(|c| self.get(*c) != Some(false))
            && self.get(Component::Store) == Some(true)
            && self.stalled_lock().iter().all(Vec::is_empty)
    }
}
