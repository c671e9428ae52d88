//! The consume loop's per-partition queues. A partition is in at most one
//! batch at a time, and a message that must be retried stays at the head of
//! its partition (retry in place): later messages of that partition wait
//! behind it, so one key's messages are never reordered.

use super::ledger::{Lane, Tp};
use super::message::Held;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

pub struct Lanes {
    lanes: HashMap<Tp, Queue>,
    /// Messages held per partition before fetching from it pauses.
    limit: usize,
}

struct Queue {
    lane: Lane,
    waiting: VecDeque<Held>,
    in_batch: usize,
    blocked_until: Option<Instant>,
    paused: bool,
}

impl Queue {
    fn held(&self) -> usize {
        self.waiting.len() + self.in_batch
    }

    fn ready(&self, now: Instant) -> bool {
        self.in_batch == 0
            && !self.waiting.is_empty()
            && self.blocked_until.is_none_or(|t| t <= now)
    }
}

impl Lanes {
    pub fn new(limit: usize) -> Self {
        Self {
            lanes: HashMap::new(),
            limit,
        }
    }

    /// Queues a fetched message; returns its partition when fetching from
    /// it should pause.
    pub fn push(&mut self, held: Held) -> Option<Tp> {
        let q = self
            .lanes
            .entry(held.lane.tp.clone())
            .or_insert_with(|| new_queue(&held.lane));
        if q.lane != held.lane {
            // Revoked and assigned again: the old queue is stale.
            *q = new_queue(&held.lane);
        }
        q.waiting.push_back(held);
        (!q.paused && q.held() >= self.limit).then(|| {
            q.paused = true;
            q.lane.tp.clone()
        })
    }

    /// Messages that a batch could take now.
    pub fn ready(&self, now: Instant) -> usize {
        self.lanes
            .values()
            .filter(|q| q.ready(now))
            .map(|q| q.waiting.len())
            .sum()
    }

    /// When the earliest partition that waits out a retry becomes ready.
    pub fn next_unblock(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter(|q| q.in_batch == 0 && !q.waiting.is_empty())
            .filter_map(|q| q.blocked_until)
            .min()
    }

    /// Takes up to `max` messages from ready partitions, oldest first; the
    /// partitions taken from are busy until `finished`.
    pub fn take_batch(&mut self, now: Instant, max: usize) -> Vec<Held> {
        let mut ready: Vec<&mut Queue> = self.lanes.values_mut().filter(|q| q.ready(now)).collect();
        ready.sort_by_key(|q| q.waiting.front().map(|h| h.incoming.received_at));
        let mut batch = Vec::new();
        for q in ready {
            let room = max.saturating_sub(batch.len());
            if room == 0 {
                break;
            }
            let n = room.min(q.waiting.len());
            batch.extend(q.waiting.drain(..n));
            q.in_batch = n;
            q.blocked_until = None;
        }
        batch
    }

    /// A batch released `lane`: `retries` (in offset order) go back to the
    /// head and hold the partition for `after`. Returns the partition when
    /// fetching from it may resume.
    pub fn finished(&mut self, lane: &Lane, retries: Vec<Held>, after: Duration) -> Option<Tp> {
        let q = self.lanes.get_mut(&lane.tp).filter(|q| q.lane == *lane)?;
        q.in_batch = 0;
        if !retries.is_empty() {
            q.blocked_until = Some(Instant::now() + after);
            for held in retries.into_iter().rev() {
                q.waiting.push_front(held);
            }
        }
        (q.paused && q.held() <= self.limit / 2).then(|| {
            q.paused = false;
            q.lane.tp.clone()
        })
    }

    /// Drops the queues of partitions this member no longer owns.
    pub fn retain(&mut self, owns: impl Fn(&Lane) -> bool) {
        self.lanes.retain(|_, q| owns(&q.lane));
    }
}

fn new_queue(lane: &Lane) -> Queue {
    Queue {
        lane: lane.clone(),
        waiting: VecDeque::new(),
        in_batch: 0,
        blocked_until: None,
        paused: false,
    }
}
