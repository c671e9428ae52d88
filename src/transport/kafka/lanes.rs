//! The consume loop's per-partition queues (see queue.rs). A partition is
//! in a few batches at a time, which never share a key, and a
//! message that must be retried goes back to the head of its partition
//! (retry in place): later messages of its key wait behind it, so one key's
//! messages are never reordered.
//!
//! The queues are bounded twice: per partition by message count, and all
//! together by bytes (what librdkafka hands over is copied here), so a
//! stalled partition cannot grow memory without bound.

use super::ledger::{Lane, Tp};
use super::message::Held;
use super::queue::Queue;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

pub struct Lanes {
    lanes: HashMap<Tp, Queue>,
    /// Messages held per partition before fetching from it pauses.
    limit: usize,
    /// Bytes held over all partitions before fetching pauses everywhere.
    max_bytes: usize,
    bytes: usize,
    /// Fetching is paused everywhere for the byte bound.
    over_bytes: bool,
    /// The last batch handed out.
    last_batch: u64,
}

/// Fetching to pause or resume, per partition.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub pause: Vec<Tp>,
    pub resume: Vec<Tp>,
}

impl Lanes {
    pub fn new(limit: usize, max_bytes: usize) -> Self {
        Self {
            lanes: HashMap::new(),
            limit,
            max_bytes,
            bytes: 0,
            over_bytes: false,
            last_batch: 0,
        }
    }

    /// Queues a fetched message; says which partitions to pause.
    pub fn push(&mut self, held: Held) -> Flow {
        let size = held.size();
        let q = self
            .lanes
            .entry(held.lane.tp.clone())
            .or_insert_with(|| Queue::new(&held.lane));
        if q.lane != held.lane {
            // Revoked and assigned again: the old queue is stale.
            self.bytes -= q.bytes;
            *q = Queue::new(&held.lane);
        }
        if q.held() == 0 {
            q.progress_at = Instant::now();
        }
        q.waiting.push_back(held);
        q.bytes += size;
        self.bytes += size;
        let mut flow = Flow::default();
        if !q.paused && q.held() >= self.limit {
            q.paused = true;
            flow.pause.push(q.lane.tp.clone());
        }
        if !self.over_bytes && self.bytes > self.max_bytes {
            self.over_bytes = true;
            flow.pause.extend(
                self.lanes
                    .values()
                    .filter(|q| !q.paused)
                    .map(|q| q.lane.tp.clone()),
            );
        }
        flow
    }

    /// Messages that a batch could take now.
    pub fn ready(&self, now: Instant) -> usize {
        self.lanes
            .values()
            .filter(|q| q.ready(now))
            .map(|q| q.waiting.len())
            .sum()
    }

    /// Messages waiting for a batch in partitions not waiting out a retry:
    /// work this process already has in hand.
    pub fn backlog(&self, now: Instant) -> usize {
        self.lanes
            .values()
            .filter(|q| q.blocked_until.is_none_or(|t| t <= now))
            .map(|q| q.waiting.len())
            .sum()
    }

    /// When the earliest partition that waits out a retry becomes ready.
    pub fn next_unblock(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter(|q| q.open())
            .filter_map(|q| q.blocked_until)
            .min()
    }

    /// Takes up to `max` messages from ready partitions, oldest first, as
    /// one batch; returns its number (for `finished`) and its messages.
    pub fn take_batch(&mut self, now: Instant, max: usize) -> (u64, Vec<Held>) {
        self.last_batch += 1;
        let id = self.last_batch;
        let mut ready: Vec<&mut Queue> = self.lanes.values_mut().filter(|q| q.ready(now)).collect();
        ready.sort_by_key(|q| q.waiting.front().map(|h| h.incoming.received_at));
        let mut batch = Vec::new();
        for q in ready {
            let room = max.saturating_sub(batch.len());
            if room == 0 {
                break;
            }
            q.take(id, room, &mut batch);
        }
        (id, batch)
    }

    /// Batch `id` released `lane`: `retries` go back in offset order and
    /// hold the partition for `after`. Says which partitions may fetch
    /// again.
    pub fn finished(&mut self, lane: &Lane, id: u64, retries: Vec<Held>, after: Duration) -> Flow {
        let mut flow = Flow::default();
        let Some(q) = self.lanes.get_mut(&lane.tp).filter(|q| q.lane == *lane) else {
            return flow;
        };
        self.bytes -= q.land(id, retries, after);
        if q.paused && q.held() <= self.limit / 2 && !self.over_bytes {
            q.paused = false;
            flow.resume.push(q.lane.tp.clone());
        }
        if self.over_bytes && self.bytes <= self.max_bytes / 2 {
            self.over_bytes = false;
            for q in self.lanes.values_mut() {
                if q.paused && q.held() <= self.limit / 2 {
                    q.paused = false;
                    flow.resume.push(q.lane.tp.clone());
                }
            }
        }
        flow
    }

    /// Drops the queues of partitions this member no longer owns.
    pub fn retain(&mut self, owns: impl Fn(&Lane) -> bool) {
        let mut freed = 0;
        self.lanes.retain(|_, q| {
            let keep = owns(&q.lane);
            if !keep {
                freed += q.bytes;
            }
            keep
        });
        self.bytes -= freed;
    }

    /// Partitions with messages waiting (or in a batch) that made no
    /// progress for `after`.
    pub fn stalled(&self, now: Instant, after: Duration) -> Vec<(Tp, Duration)> {
        let mut out: Vec<(Tp, Duration)> = self
            .lanes
            .values()
            .filter(|q| q.held() > 0)
            .map(|q| {
                (
                    q.lane.tp.clone(),
                    now.saturating_duration_since(q.progress_at),
                )
            })
            .filter(|(_, idle)| *idle >= after)
            .collect();
        out.sort();
        out
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
