//! Retries that use no attempt (a handler fault, a provider still working
//! on the key: 409) back off on a streak of their own, counted per key.

use crate::identity::Identity;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Keys whose uncounted retries are remembered at most (a fault of a
/// whole deployment should not grow memory without bound).
const STREAKS_KEPT: usize = 10_000;

#[derive(Default)]
pub(super) struct Streaks(Mutex<HashMap<Identity, (u32, Instant)>>);

/// A key's retries in a row that used no attempt, this one included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Streak {
    /// How many.
    pub count: u32,
    /// Since the first of them.
    pub lasted: Duration,
}

impl Streaks {
    /// The key's streak of uncounted retries after this one (`counts`:
    /// one more; else the streak ends).
    pub(super) fn next(&self, identity: &Identity, counts: bool) -> Streak {
        let mut streaks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !counts {
            streaks.remove(identity);
            return Streak::default();
        }
        if streaks.len() >= STREAKS_KEPT && !streaks.contains_key(identity) {
            streaks.clear();
        }
        let (n, since) = streaks
            .entry(identity.clone())
            .or_insert((0, Instant::now()));
        *n = n.saturating_add(1);
        Streak {
            count: *n,
            lasted: since.elapsed(),
        }
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

    #[test]
    fn a_streak_grows_per_key_and_ends_with_a_counted_retry() {
        let s = Streaks::default();
        assert_eq!(s.next(&id("a"), true).count, 1);
        assert_eq!(s.next(&id("a"), true).count, 2);
        assert_eq!(s.next(&id("b"), true).count, 1, "another key has its own");
        assert_eq!(s.next(&id("a"), false), Streak::default());
        assert_eq!(s.next(&id("a"), true).count, 1, "it starts over");
    }

    #[test]
    fn at_most_so_many_keys_are_remembered() {
        let s = Streaks::default();
        for i in 0..STREAKS_KEPT {
            s.next(&id(&format!("k{i}")), true);
        }
        s.next(&id("k0"), true);
        assert_eq!(s.0.lock().unwrap().len(), STREAKS_KEPT);
        s.next(&id("new"), true);
        assert_eq!(
            s.0.lock().unwrap().len(),
            1,
            "full: forgotten, then the new key"
        );
    }
}
