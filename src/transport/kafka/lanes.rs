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

pub(super) struct Lanes {
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
pub(super) struct Flow {
    pub pause: Vec<Tp>,
    pub resume: Vec<Tp>,
}

impl Lanes {
    pub(super) fn new(limit: usize, max_bytes: usize) -> Self {
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
    pub(super) fn push(&mut self, held: Held) -> Flow {
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
        if self.bytes > self.max_bytes {
            self.over_bytes = true;
        }
        if self.over_bytes {
            // Marked paused, so that falling below half the bound resumes
            // them; a partition first seen while over the bound pauses too.
            for q in self.lanes.values_mut().filter(|q| !q.paused) {
                q.paused = true;
                flow.pause.push(q.lane.tp.clone());
            }
        }
        flow
    }

    /// Messages that a batch could take now.
    pub(super) fn ready(&self, now: Instant) -> usize {
        self.lanes
            .values()
            .filter(|q| q.ready(now))
            .map(|q| q.waiting.len())
            .sum()
    }

    /// Messages waiting for a batch in partitions not waiting out a retry:
    /// work this process already has in hand.
    pub(super) fn backlog(&self, now: Instant) -> usize {
        self.lanes
            .values()
            .filter(|q| q.blocked_until.is_none_or(|t| t <= now))
            .map(|q| q.waiting.len())
            .sum()
    }

    /// When the earliest partition that waits out a retry becomes ready.
    pub(super) fn next_unblock(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter(|q| q.open())
            .filter_map(|q| q.blocked_until)
            .min()
    }

    /// Takes up to `max` messages from ready partitions, oldest first, as
    /// one batch; returns its number (for `finished`) and its messages.
    pub(super) fn take_batch(&mut self, now: Instant, max: usize) -> (u64, Vec<Held>) {
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
    pub(super) fn finished(
        &mut self,
        lane: &Lane,
        id: u64,
        retries: Vec<Held>,
        after: Duration,
    ) -> Flow {
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
    pub(super) fn retain(&mut self, owns: impl Fn(&Lane) -> bool) {
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
    pub(super) fn stalled(&self, now: Instant, after: Duration) -> Vec<(Tp, Duration)> {
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

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Incoming, Source};

    fn lane(partition: i32) -> Lane {
        Lane {
            tp: Tp {
                topic: "t".into(),
                partition,
            },
            generation: 1,
        }
    }

    fn held(partition: i32, offset: i64, body_len: usize) -> Held {
        let source = Source::Kafka {
            topic: "t".into(),
            partition,
            offset,
        };
        Held {
            lane: lane(partition),
            offset,
            key: None,
            hint: None,
            incoming: Incoming::new(source, vec![b'x'; body_len]),
        }
    }

    #[test]
    fn the_buffer_pauses_every_partition_past_its_byte_bound_and_resumes_them_below_half() {
        let mut lanes = Lanes::new(10_000, 10_000);
        assert_eq!(lanes.push(held(0, 0, 3000)), Flow::default());
        assert_eq!(lanes.push(held(1, 0, 3000)), Flow::default());
        let over = lanes.push(held(0, 1, 5000));
        let mut paused = over.pause.clone();
        paused.sort();
        assert_eq!(
            paused,
            vec![lane(0).tp, lane(1).tp],
            "both partitions pause"
        );
        assert!(lanes.bytes() > 10_000);

        let (id, batch) = lanes.take_batch(Instant::now(), 100);
        assert_eq!(batch.len(), 3);
        let mut first = lanes
            .finished(&lane(0), id, Vec::new(), Duration::ZERO)
            .resume;
        first.sort();
        assert_eq!(
            first,
            vec![lane(0).tp, lane(1).tp],
            "partition 1 still holds 3 kB, below half the bound: both fetch again"
        );
        let second = lanes.finished(&lane(1), id, Vec::new(), Duration::ZERO);
        assert_eq!(lanes.bytes(), 0);
        assert!(second.resume.is_empty(), "{second:?}");
    }

    #[test]
    fn a_partition_first_seen_while_over_the_byte_bound_is_paused_too() {
        let mut lanes = Lanes::new(10_000, 1000);
        lanes.push(held(0, 0, 2000));
        let late = lanes.push(held(7, 0, 10));
        assert_eq!(late.pause, vec![lane(7).tp]);
        let (id, _) = lanes.take_batch(Instant::now(), 100);
        let mut resumed = lanes
            .finished(&lane(0), id, Vec::new(), Duration::ZERO)
            .resume;
        resumed.sort();
        assert_eq!(resumed, vec![lane(0).tp, lane(7).tp]);
    }

    #[test]
    fn retries_keep_their_bytes_and_a_message_bigger_than_the_bound_still_flows() {
        let mut lanes = Lanes::new(10_000, 1000);
        let flow = lanes.push(held(0, 0, 5000));
        assert_eq!(flow.pause, vec![lane(0).tp]);
        let (id, batch) = lanes.take_batch(Instant::now(), 100);
        assert_eq!(
            batch.len(),
            1,
            "a paused partition's buffered message is still taken"
        );
        let retried = lanes.finished(&lane(0), id, batch, Duration::ZERO);
        assert!(retried.resume.is_empty(), "still over: {retried:?}");
        assert!(lanes.bytes() > 5000, "the retried message is still held");
        let (id, again) = lanes.take_batch(Instant::now(), 100);
        assert_eq!(again.len(), 1);
        let done = lanes.finished(&lane(0), id, Vec::new(), Duration::ZERO);
        assert_eq!(done.resume, vec![lane(0).tp]);
        assert_eq!(lanes.bytes(), 0);
    }

    #[test]
    fn a_partition_with_waiting_messages_and_no_outcome_is_stalled_until_one_lands() {
        let mut lanes = Lanes::new(10_000, 1_000_000);
        let start = Instant::now();
        lanes.push(held(3, 0, 10));
        let after = Duration::from_secs(60);
        assert!(lanes.stalled(start, after).is_empty());
        let (id, batch) = lanes.take_batch(start, 10);
        lanes.finished(&lane(3), id, batch, Duration::ZERO);
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(
            lanes.stalled(later, after).len(),
            1,
            "a retry is no progress"
        );
        let (id, batch) = lanes.take_batch(Instant::now(), 10);
        assert_eq!(batch.len(), 1);
        lanes.finished(&lane(3), id, Vec::new(), Duration::ZERO);
        assert!(lanes.stalled(later, after).is_empty(), "nothing waits");
    }
}
