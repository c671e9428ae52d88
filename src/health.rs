//! What /readyz reports: is the store reachable, are the brokers connected.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

const OFF: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Store,
    Kafka,
    Amqp,
}

impl Component {
    pub const ALL: [Component; 3] = [Component::Store, Component::Kafka, Component::Amqp];

    pub fn name(self) -> &'static str {
        match self {
            Component::Store => "store",
            Component::Kafka => "kafka",
            Component::Amqp => "amqp",
        }
    }
}

/// Shared readiness flags. A component that is not configured stays off and
/// does not count against readiness.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<[AtomicU8; 3]>);

impl Health {
    pub fn set(&self, c: Component, up: bool) {
        self.0[c as usize].store(if up { UP } else { DOWN }, Ordering::Relaxed);
    }

    /// None: not configured; Some(up).
    pub fn get(&self, c: Component) -> Option<bool> {
        match self.0[c as usize].load(Ordering::Relaxed) {
            OFF => None,
            v => Some(v == UP),
        }
    }

    pub fn ready(&self) -> bool {
        Component::ALL.iter().all(|c| self.get(*c) != Some(false))
            && self.get(Component::Store) == Some(true)
    }
}
