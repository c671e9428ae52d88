//! State shared by the consume loop, the batch tasks and librdkafka's
//! rebalance callback: which partitions this member owns, which offsets of
//! each still lack a durable outcome, and which have a batch running.

use super::offsets::OffsetTracker;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Tp {
    pub topic: String,
    pub partition: i32,
}

impl fmt::Display for Tp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// One ownership period of a partition. A revoke and a later assign of
/// the same partition are different lanes: late results of the old one are
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Lane {
    pub tp: Tp,
    pub generation: u64,
}

#[derive(Default)]
pub(super) struct Ledger {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    parts: HashMap<Tp, Part>,
    generations: u64,
}

struct Part {
    generation: u64,
    offsets: OffsetTracker,
    batches: usize,
    committed: Option<i64>,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not wedge offset bookkeeping.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn assign(&self, tps: impl IntoIterator<Item = Tp>) {
        let mut s = self.lock();
        for tp in tps {
            s.generations += 1;
            let part = Part {
                generation: s.generations,
                offsets: OffsetTracker::default(),
                batches: 0,
                committed: None,
            };
            s.parts.insert(tp, part);
        }
    }

    /// Registers a fetched message; the lane it belongs to, or None when the
    /// partition is not owned or the offset was seen already.
    pub(super) fn received(&self, tp: &Tp, offset: i64) -> Option<Lane> {
        let mut s = self.lock();
        let part = s.parts.get_mut(tp)?;
        // Where this member started is committed already (or is the log
        // start): only progress past it is worth a commit.
        part.committed.get_or_insert(offset);
        part.offsets.received(offset).then(|| Lane {
            tp: tp.clone(),
            generation: part.generation,
        })
    }

    /// The offset this member started consuming `tp` from (or committed
    /// since), once it received a message of it.
    pub(super) fn started_at(&self, tp: &Tp) -> Option<i64> {
        self.lock().parts.get(tp).and_then(|p| p.committed)
    }

    pub(super) fn owns(&self, lane: &Lane) -> bool {
        self.lock()
            .parts
            .get(&lane.tp)
            .is_some_and(|p| p.generation == lane.generation)
    }

    pub(super) fn batch_started(&self, lanes: &[Lane]) {
        let mut s = self.lock();
        for lane in lanes {
            if let Some(p) = s.parts.get_mut(&lane.tp) {
                if p.generation == lane.generation {
                    p.batches += 1;
                }
            }
        }
    }

    /// Records the durable outcomes of a finished batch and wakes a revoke
    /// that waits for it.
    pub(super) fn batch_finished(&self, lanes: &[Lane], durable: &[(Lane, i64)]) {
        let mut s = self.lock();
        for (lane, offset) in durable {
            if let Some(p) = s.parts.get_mut(&lane.tp) {
                if p.generation == lane.generation {
                    p.offsets.done(*offset);
                }
            }
        }
        for lane in lanes {
            if let Some(p) = s.parts.get_mut(&lane.tp) {
                if p.generation == lane.generation {
                    p.batches = p.batches.saturating_sub(1);
                }
            }
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Forgets every running batch (their tasks were aborted): their
    /// messages stay uncommitted and come back.
    pub(super) fn abandon_batches(&self) {
        let mut s = self.lock();
        for p in s.parts.values_mut() {
            p.batches = 0;
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Waits until no batch holds any of `tps`, or the deadline. True when
    /// they are all idle.
    pub(super) fn wait_idle(&self, tps: &[Tp], deadline: Instant) -> bool {
        let mut s = self.lock();
        loop {
            let busy = tps
                .iter()
                .any(|tp| s.parts.get(tp).is_some_and(|p| p.batches > 0));
            if !busy {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Commit positions that are ahead of the last confirmed commit; all
    /// owned partitions, or only `only`.
    pub(super) fn to_commit(&self, only: Option<&[Tp]>) -> Vec<(Tp, i64)> {
        let s = self.lock();
        s.parts
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, p)| {
                let pos = p.offsets.position()?;
                p.committed
                    .is_some_and(|c| pos > c)
                    .then(|| (tp.clone(), pos))
            })
            .collect()
    }

    /// The broker confirmed a commit.
    pub(super) fn committed(&self, tp: &Tp, offset: i64) {
        if let Some(p) = self.lock().parts.get_mut(tp) {
            p.committed = Some(p.committed.map_or(offset, |c| c.max(offset)));
        }
    }

    pub(super) fn remove(&self, tps: &[Tp]) {
        let mut s = self.lock();
        for tp in tps {
            s.parts.remove(tp);
        }
        drop(s);
        self.changed.notify_all();
    }

    pub(super) fn owned(&self) -> Vec<Tp> {
        self.lock().parts.keys().cloned().collect()
    }

    /// Messages received and not yet durable, over all partitions.
    pub(super) fn pending(&self) -> usize {
        self.lock()
            .parts
            .values()
            .map(|p| p.offsets.pending())
            .sum()
    }
}
