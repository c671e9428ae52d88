//! What /readyz reports: is the store reachable, are the brokers connected,
//! and if not, why.

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

#[derive(Debug, Default)]
struct Flags {
    state: [AtomicU8; 3],
    /// Why a component is down, when its owner said.
    reasons: Mutex<[Option<String>; 3]>,
}

/// Shared readiness flags. A component that is not configured stays off and
/// does not count against readiness.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Flags>);

impl Health {
    pub fn set(&self, c: Component, up: bool) {
        self.0.state[c as usize].store(if up { UP } else { DOWN }, Ordering::Relaxed);
        self.set_reason(c, None);
    }

    /// Down, with a reason /readyz shows (e.g. `unreachable: <cause>`).
    pub fn set_down(&self, c: Component, reason: impl Into<String>) {
        self.0.state[c as usize].store(DOWN, Ordering::Relaxed);
        self.set_reason(c, Some(reason.into()));
    }

    /// None: not configured; Some(up).
    pub fn get(&self, c: Component) -> Option<bool> {
        match self.0.state[c as usize].load(Ordering::Relaxed) {
            OFF => None,
            v => Some(v == UP),
        }
    }

    pub fn reason(&self, c: Component) -> Option<String> {
        let reasons = self.0.reasons.lock().unwrap_or_else(|p| p.into_inner());
        reasons[c as usize].clone()
    }

    pub fn ready(&self) -> bool {
        Component::ALL.iter().all(|c| self.get(*c) != Some(false))
            && self.get(Component::Store) == Some(true)
    }

    fn set_reason(&self, c: Component, reason: Option<String>) {
        let mut reasons = self.0.reasons.lock().unwrap_or_else(|p| p.into_inner());
        reasons[c as usize] = reason;
    }
}
